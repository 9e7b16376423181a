#include "src/store/socket.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstring>
#include <memory>

#include <fmt/format.h>

#include "rdmacc/error.hpp"

namespace rdmacc::net {
namespace {

struct AddrInfoDeleter {
  void operator()(addrinfo* ai) const noexcept { freeaddrinfo(ai); }
};
using AddrInfoPtr = std::unique_ptr<addrinfo, AddrInfoDeleter>;

AddrInfoPtr resolve(const std::string& host, uint16_t port, bool passive, std::string& detail) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = passive ? AI_PASSIVE : 0;
  addrinfo* result = nullptr;
  std::string service = std::to_string(port);
  int rc = getaddrinfo(host.empty() ? nullptr : host.c_str(), service.c_str(), &hints, &result);
  if (rc != 0) {
    detail = gai_strerror(rc);
    return nullptr;
  }
  return AddrInfoPtr(result);
}

int pollOne(int fd, short events, Clock::time_point deadline) {
  while (true) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) return 0;
    pollfd p{fd, events, 0};
    int rc = ::poll(&p, 1, static_cast<int>(std::min<int64_t>(left.count() + 1, 1000)));
    if (rc < 0 && errno == EINTR) continue;
    if (rc < 0) throw errnoError(ErrorKind::Store, "poll", errno, "waiting on a store socket");
    if (rc > 0) return rc;
  }
}

}  // namespace

void Fd::reset(int fd) noexcept {
  if (fd_ >= 0) ::close(fd_);
  fd_ = fd;
}

Fd listenTcp(const std::string& host, uint16_t port, int backlog) {
  std::string detail;
  auto ai = resolve(host, port, true, detail);
  if (!ai) {
    throw Error(ErrorKind::Store,
                fmt::format("cannot resolve store address {}:{}: {}", host, port, detail),
                "check MASTER_ADDR");
  }
  int lastErr = 0;
  for (addrinfo* a = ai.get(); a != nullptr; a = a->ai_next) {
    Fd fd(::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol));
    if (!fd) {
      lastErr = errno;
      continue;
    }
    int one = 1;
    ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (::bind(fd.get(), a->ai_addr, a->ai_addrlen) == 0 && ::listen(fd.get(), backlog) == 0) {
      return fd;
    }
    lastErr = errno;
  }
  throw errnoError(
      ErrorKind::Store, "bind/listen", lastErr,
      fmt::format("cannot listen for the store on {}:{}", host, port),
      lastErr == EADDRINUSE ? "another process uses this port; pick another MASTER_PORT" : "");
}

std::string storeBindAddress(const std::string& masterAddr, std::string& why) {
  auto text = [](const sockaddr* sa) {
    std::array<char, INET6_ADDRSTRLEN> buf{};
    const void* raw =
        sa->sa_family == AF_INET
            ? static_cast<const void*>(&reinterpret_cast<const sockaddr_in*>(sa)->sin_addr)
            : static_cast<const void*>(&reinterpret_cast<const sockaddr_in6*>(sa)->sin6_addr);
    return ::inet_ntop(sa->sa_family, raw, buf.data(), buf.size()) ? std::string(buf.data())
                                                                   : std::string();
  };
  in_addr v4{};
  in6_addr v6{};
  if ((::inet_pton(AF_INET, masterAddr.c_str(), &v4) == 1 && (ntohl(v4.s_addr) >> 24) == 127) ||
      (::inet_pton(AF_INET6, masterAddr.c_str(), &v6) == 1 && IN6_IS_ADDR_LOOPBACK(&v6)) ||
      masterAddr == "localhost") {
    why = "MASTER_ADDR is a loopback address: every rank is on this host";
    return masterAddr;
  }
  std::string detail;
  auto ai = resolve(masterAddr, 0, true, detail);
  ifaddrs* interfaces = nullptr;
  if (ai && ::getifaddrs(&interfaces) == 0) {
    std::unique_ptr<ifaddrs, decltype(&::freeifaddrs)> owned(interfaces, &::freeifaddrs);
    for (addrinfo* a = ai.get(); a != nullptr; a = a->ai_next) {
      const std::string address = text(a->ai_addr);
      if (address.empty() || address.starts_with("127.") || address == "::1") continue;
      for (ifaddrs* i = interfaces; i != nullptr; i = i->ifa_next) {
        if (i->ifa_addr == nullptr || i->ifa_addr->sa_family != a->ai_addr->sa_family) continue;
        if (text(i->ifa_addr) == address) {
          why = fmt::format("MASTER_ADDR {} is {} on this host's interface {}", masterAddr, address,
                            i->ifa_name);
          return address;
        }
      }
    }
  }
  why = fmt::format(
      "MASTER_ADDR {} is not an address of this host's interfaces (a name that resolves to a "
      "loopback alias here, or a NAT address): listening on every interface",
      masterAddr);
  return "0.0.0.0";
}

uint16_t localPort(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) {
    throw errnoError(ErrorKind::Store, "getsockname", errno, "reading the store's port");
  }
  if (ss.ss_family == AF_INET6) return ntohs(reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port);
  return ntohs(reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
}

Fd tryConnectTcp(const std::string& host, uint16_t port, Clock::time_point deadline, int& errnum,
                 std::string& detail) {
  auto ai = resolve(host, port, false, detail);
  if (!ai) {
    errnum = 0;
    return Fd();
  }
  for (addrinfo* a = ai.get(); a != nullptr; a = a->ai_next) {
    Fd fd(::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol));
    if (!fd) {
      errnum = errno;
      continue;
    }
    // Non-blocking: connect() returns at once, and the deadline bounds the
    // wait for the handshake (a blocking connect waits out the kernel's SYN
    // retries, over a minute against a full backlog).
    int rc = ::connect(fd.get(), a->ai_addr, a->ai_addrlen);
    if (rc != 0 && errno == EINPROGRESS) {
      if (pollOne(fd.get(), POLLOUT, deadline) == 0) {
        errnum = ETIMEDOUT;
        continue;
      }
      int error = 0;
      socklen_t length = sizeof error;
      rc =
          ::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &error, &length) == 0 && error == 0 ? 0 : -1;
      errno = error != 0 ? error : errno;
    }
    if (rc == 0) {
      int flags = ::fcntl(fd.get(), F_GETFL);
      if (flags >= 0) ::fcntl(fd.get(), F_SETFL, flags & ~O_NONBLOCK);
      setNoDelay(fd.get());
      return fd;
    }
    errnum = errno;
  }
  detail = std::strerror(errnum);
  return Fd();
}

void setNonBlocking(int fd) {
  int flags = ::fcntl(fd, F_GETFL);
  if (flags < 0 || ::fcntl(fd, F_SETFL, flags | O_NONBLOCK) < 0) {
    throw errnoError(ErrorKind::Internal, "fcntl", errno, "making a socket non-blocking");
  }
}

void setNoDelay(int fd) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

bool sendAll(int fd, const void* data, size_t size, Clock::time_point deadline) {
  const auto* p = static_cast<const uint8_t*>(data);
  while (size > 0) {
    ssize_t n = ::send(fd, p, size, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      p += n;
      size -= static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (pollOne(fd, POLLOUT, deadline) == 0) return false;
      continue;
    }
    throw errnoError(ErrorKind::Store, "send", errno, "sending to the store");
  }
  return true;
}

bool recvAll(int fd, void* data, size_t size, Clock::time_point deadline) {
  auto* p = static_cast<uint8_t*>(data);
  while (size > 0) {
    ssize_t n = ::recv(fd, p, size, MSG_DONTWAIT);
    if (n > 0) {
      p += n;
      size -= static_cast<size_t>(n);
      continue;
    }
    if (n == 0) throw Error(ErrorKind::Store, "the store closed the connection");
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      if (pollOne(fd, POLLIN, deadline) == 0) return false;
      continue;
    }
    throw errnoError(ErrorKind::Store, "recv", errno, "receiving from the store");
  }
  return true;
}

}  // namespace rdmacc::net
