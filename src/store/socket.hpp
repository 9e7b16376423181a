// TCP socket helpers for the store: RAII descriptors, deadlines everywhere.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>

namespace rdmacc::net {

using Clock = std::chrono::steady_clock;

// Owns a file descriptor. Move-only; closing never throws.
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) noexcept : fd_(fd) {}
  Fd(Fd&& other) noexcept : fd_(other.release()) {}
  Fd& operator=(Fd&& other) noexcept {
    if (this != &other) reset(other.release());
    return *this;
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() { reset(); }
  int get() const noexcept { return fd_; }
  explicit operator bool() const noexcept { return fd_ >= 0; }
  int release() noexcept {
    int fd = fd_;
    fd_ = -1;
    return fd;
  }
  void reset(int fd = -1) noexcept;

 private:
  int fd_ = -1;
};

// Listens on host:port (port 0: any free port). Throws Error(Store).
Fd listenTcp(const std::string& host, uint16_t port, int backlog = 1024);
uint16_t localPort(int fd);
// Where the store host listens when ranks reach it at `masterAddr`: that
// address itself when it is a loopback literal (127.0.0.0/8, ::1, localhost: the job is
// on one host) or resolves to an address of one of this host's interfaces
// (other hosts' clients reach it there, nothing else can); otherwise every
// interface ("0.0.0.0": a name that resolves to a loopback alias such as
// Debian's 127.0.1.1 here may resolve elsewhere to the real address). `why`
// says which and why, for the log.
std::string storeBindAddress(const std::string& masterAddr, std::string& why);
// Connects once, giving up at `deadline` (a full backlog or a silent host
// does not block past it); returns an empty Fd and sets errnum on failure.
Fd tryConnectTcp(const std::string& host, uint16_t port, Clock::time_point deadline, int& errnum,
                 std::string& detail);
void setNonBlocking(int fd);
void setNoDelay(int fd);
// Blocking I/O bounded by a deadline; return false on timeout, throw on error/EOF.
bool sendAll(int fd, const void* data, size_t size, Clock::time_point deadline);
bool recvAll(int fd, void* data, size_t size, Clock::time_point deadline);

}  // namespace rdmacc::net
