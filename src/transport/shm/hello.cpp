// Who a local peer is, in the kernel's words. A peer's record (in the store)
// gives its pid, and single-copy writes go to that pid; a hostile peer could
// give a third local rank's pid there (and copy that rank's base and nonce,
// which every local peer can read) and steer this rank's writes into that
// rank's process. So each rank sends every local peer a hello, its rank,
// through the peer's doorbell; the doorbell has SO_PASSCRED, so each
// datagram arrives with the sender's pid as the kernel knows it (a process
// without CAP_SYS_ADMIN cannot claim another's). Single-copy writes to a
// peer start once a hello claiming its rank came from the pid its record
// gives (docs/security.md, "What a peer on the same host can write").
#include <sys/socket.h>

#include <cerrno>
#include <cstring>

#include "rdmacc/log.hpp"
#include "src/transport/shm/transport_impl.hpp"

namespace rdmacc::shm {
namespace {

constexpr uint32_t kHelloMagic = 0x6c6c6568;  // "hell(o)"

struct Hello {
  uint32_t magic = kHelloMagic;
  uint32_t rank = 0;  // the sender's, in this group
};

// Read per poll at most: the progress lock is held while the doorbell is
// drained, and a flood of wake-ups (only this user's processes can send
// them) must not keep it; what is left wakes the next poll at once.
constexpr int kDrainPerPoll = 64;

}  // namespace

void ShmTransport::sendHello(Peer& p) {
  const Hello hello{.rank = static_cast<uint32_t>(rank_)};
  const bool owed = p.helloOwed;
  if (::sendto(bell_.get(), &hello, sizeof hello, MSG_DONTWAIT | MSG_NOSIGNAL,
               reinterpret_cast<const sockaddr*>(&p.doorbell), p.doorbellLength) < 0 &&
      (errno == EAGAIN || errno == EWOULDBLOCK || errno == ENOBUFS)) {
    // Its queue is full (net.unix.max_dgram_qlen, 10 by default, and a host
    // of many ranks says hello at once): sent again at our next polls.
    p.helloOwed = true;
  } else {
    // Sent, or refused for good (the peer left): it falls back to the slots.
    p.helloOwed = false;
  }
  if (owed != p.helloOwed) hellosOwed_ += p.helloOwed ? 1 : size_t(-1);
}

void ShmTransport::sendOwedHellos() {
  if (hellosOwed_ == 0) return;
  for (int rank = 0; rank < size_; ++rank) {
    if (peers_[rank].helloOwed) sendHello(peers_[rank]);
  }
}

void ShmTransport::drainDoorbell() {
  for (int i = 0; i < kDrainPerPoll; ++i) {
    Hello hello;
    iovec data{&hello, sizeof hello};
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(ucred))];
    msghdr m{};
    m.msg_iov = &data;
    m.msg_iovlen = 1;
    m.msg_control = control;
    m.msg_controllen = sizeof control;
    const ssize_t n = ::recvmsg(doorbell_.get(), &m, MSG_DONTWAIT);
    if (n < 0) return;
    if (n != static_cast<ssize_t>(sizeof hello)) continue;  // a wake-up
    int pid = 0;
    for (cmsghdr* c = CMSG_FIRSTHDR(&m); c != nullptr; c = CMSG_NXTHDR(&m, c)) {
      if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_CREDENTIALS) {
        ucred cred{};
        std::memcpy(&cred, CMSG_DATA(c), sizeof cred);
        pid = cred.pid;
      }
    }
    takeHello(&hello, sizeof hello, pid);
  }
}

// `senderPid`: the kernel's, translated into our pid namespace (0 when the
// sender's is not visible from ours).
void ShmTransport::takeHello(const void* data, size_t bytes, int senderPid) {
  Hello hello;
  if (bytes != sizeof hello) return;
  std::memcpy(&hello, data, sizeof hello);
  if (hello.magic != kHelloMagic) return;
  if (hello.rank >= static_cast<uint32_t>(size_) || !peers_[static_cast<int>(hello.rank)].carried) {
    log(LogLevel::Warn, "pid {} sent a hello as rank {}, which is no local peer of this rank's",
        senderPid, hello.rank);
    return;
  }
  const int rank = static_cast<int>(hello.rank);
  Peer& p = peers_[rank];
  if (senderPid == p.pid) {
    if (!p.pidVerified && p.singleCopy) {
      --unverified_;
      log(LogLevel::Debug, "single-copy writes to rank {} (pid {}): its pid is the kernel's word",
          rank, p.pid);
    }
    p.pidVerified = true;
  } else if (!p.mismatchLogged) {
    // Not taken: a hello from the right process may still come (another
    // local process could claim this rank's name to deny it the shortcut).
    p.mismatchLogged = true;
    log(LogLevel::Warn,
        "a hello as rank {} came from pid {} (the kernel's word), but its record gives pid {}: "
        "no single-copy writes to it unless pid {} says hello",
        rank, senderPid, p.pid, p.pid);
  }
}

}  // namespace rdmacc::shm
