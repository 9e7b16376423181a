// The TCP store server (TCPStoreServer): one thread, any number of clients,
// each served inside its own error handler; the client is store/tcp_store.cpp.
// This file owns the connections; the commands are in server_commands.cpp.
#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <map>
#include <mutex>
#include <thread>

#include <fmt/format.h>

#include "rdmacc/error.hpp"
#include "rdmacc/log.hpp"
#include "rdmacc/store.hpp"
#include "src/store/server_state.hpp"
#include "src/store/store_util.hpp"

namespace rdmacc {
using net::Clock;
using net::Fd;

namespace {

constexpr size_t kMaxClients = 16384;
// File descriptors kept free below RLIMIT_NOFILE for the rest of the process
// (the store runs inside rank 0, which also needs its own).
constexpr size_t kReservedFds = 64;
// A client whose replies wait unsent beyond this is not read from (nor are
// its queued requests run) until it reads them: back-pressure, so a client
// that pipelines requests for a large value and never reads holds at most
// this plus one reply.
constexpr size_t kOutputHighWater = 4u << 20;

// Without a key, a connection that never sent a byte for this long may be
// closed to make room for a new one when descriptors run out.
constexpr auto kQuietEvictAge = std::chrono::seconds(1);

}  // namespace

size_t storeClientLimit() {
  rlimit rl{};
  if (::getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
    rlimit raised = rl;
    raised.rlim_cur = rl.rlim_max;
    if (::setrlimit(RLIMIT_NOFILE, &raised) == 0) rl = raised;
  }
  if (::getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY) return kMaxClients;
  const auto cur = static_cast<size_t>(rl.rlim_cur);
  return cur <= kReservedFds * 2 ? cur / 2 : std::min(kMaxClients, cur - kReservedFds);
}

// The challenge-response of a client that has not authenticated yet
// (store/protocol.hpp); consumes its frames from c.in at offset. False:
// drop it (told why, when it sent a request instead).
bool TCPStoreServer::State::authenticate(Client& c, size_t& offset) {
  while (c.auth != Client::Auth::Open) {
    sp::AuthFrame f;
    const auto r = sp::decode(c.in.data() + offset, c.in.size() - offset, f);
    if (r.state == sp::Decode::NeedMore) return true;
    const bool hello = c.auth == Client::Auth::AwaitHello;
    if (r.state == sp::Decode::Malformed ||
        f.tag != (hello ? sp::AuthTag::Hello : sp::AuthTag::Proof) ||
        f.body.size() != (hello ? auth::kNonceBytes : auth::kMacBytes)) {
      warn("dropping a client that did not authenticate ({})",
           r.state == sp::Decode::Malformed ? r.reason : "an unexpected authentication frame");
      // A client without the key sent a request: tell it what is missing.
      auto frame = sp::encode(
          sp::Response{.status = sp::Status::Error,
                       .error = "this store requires authentication: set RDMACC_AUTH_KEY (or "
                                "RDMACC_AUTH_KEY_FILE) to the job's key on this process too"});
      ssize_t ignored = ::send(c.fd.get(), frame.data(), frame.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
      (void)ignored;
      return false;
    }
    offset += r.consumed;
    if (hello) {
      std::copy(f.body.begin(), f.body.end(), c.clientNonce.begin());
      c.serverNonce = auth::nonce();
      const auth::Mac proof =
          auth::mac(authKey, "rdmacc store server", c.clientNonce, c.serverNonce);
      sp::AuthFrame challenge{.tag = sp::AuthTag::Challenge};
      challenge.body.assign(c.serverNonce.begin(), c.serverNonce.end());
      challenge.body.insert(challenge.body.end(), proof.begin(), proof.end());
      queue(c, sp::encode(challenge));
      c.auth = Client::Auth::AwaitProof;
    } else {
      const auth::Mac want =
          auth::mac(authKey, "rdmacc store client", c.serverNonce, c.clientNonce);
      if (!auth::same(want, f.body.data())) {
        warn("dropping a client whose proof of the key is wrong (another key?)");
        return false;
      }
      c.auth = Client::Auth::Open;
    }
  }
  return true;
}

// Decodes and runs the client's queued frames; false if it must be dropped.
bool TCPStoreServer::State::process(uint64_t id, Client& c) {
  size_t offset = 0;
  if (c.auth != Client::Auth::Open) {
    if (!authenticate(c, offset)) return false;
    if (c.auth != Client::Auth::Open) {
      inputHeld -= offset;
      c.in.erase(c.in.begin(), c.in.begin() + static_cast<ptrdiff_t>(offset));
      return true;
    }
  }
  if (c.blocked) {
    if (!ready(c.pending, c.present)) return true;
    if (execute(c.pending, c) == Outcome::NeedRoom) {
      awaitRoom(id, c);
      return true;
    }
    unblock(id, c);
  }
  while (!c.blocked && c.backlog() <= kOutputHighWater) {
    sp::Request req;
    auto r = sp::decode(c.in.data() + offset, c.in.size() - offset, req);
    if (r.state == sp::Decode::NeedMore) break;
    if (r.state == sp::Decode::Malformed) {
      warn("dropping a client that sent a malformed frame ({})", r.reason);
      return false;
    }
    const Outcome done = execute(req, c);
    if (done == Outcome::NeedRoom) {  // the frame stays in c.in until there is room
      awaitRoom(id, c);
      break;
    }
    offset += r.consumed;
    c.awaitsRoom = false;
    ++requests[static_cast<size_t>(req.command) - 1];
    if (req.command == sp::Command::Set || req.command == sp::Command::Add ||
        req.command == sp::Command::Delete) {
      mutated(req.keys[0], req.command == sp::Command::Delete);
    }
    if (done == Outcome::NeedKeys) block(id, c, std::move(req));
  }
  inputHeld -= offset;
  c.in.erase(c.in.begin(), c.in.begin() + static_cast<ptrdiff_t>(offset));
  return true;
}

bool TCPStoreServer::State::flush(Client& c) {
  while (c.backlog() > 0) {
    ssize_t n =
        ::send(c.fd.get(), c.out.data() + c.outSent, c.backlog(), MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      c.outSent += static_cast<size_t>(n);
      outputHeld -= static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) break;
    return false;
  }
  if (c.backlog() == 0) {
    c.out.clear();
    c.outSent = 0;
  }
  return true;
}

bool TCPStoreServer::State::readFrom(Client& c) {
  uint8_t buf[65536];
  while (true) {
    ssize_t n = ::recv(c.fd.get(), buf, sizeof buf, MSG_DONTWAIT);
    if (n > 0) {
      c.in.insert(c.in.end(), buf, buf + n);
      inputHeld += static_cast<size_t>(n);
      c.lastInput = Clock::now();
      c.spoke = true;
      // A blocked client may not pile up unbounded input, nor all of them
      // together more than the budget.
      if (c.in.size() > sp::kMaxFrameBytes + 8) {
        warn("dropping a client that sent {} bytes it has not waited for", c.in.size());
        return false;
      }
      if (inputHeld > limits.inputBudget) {
        warn("dropping a client: {} bytes of unfinished requests held for all clients", inputHeld);
        return false;
      }
      continue;
    }
    if (n == 0) return false;
    return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR;
  }
}

void TCPStoreServer::State::acceptAll() {
  while (true) {
    int fd = ::accept4(listenFd.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      // Out of descriptors: an idle unproven connection makes room first.
      if ((errno == EMFILE || errno == ENFILE) && evictOneUnproven()) continue;
      if ((errno == EMFILE || errno == ENFILE) && spareFd) {
        // Out of descriptors: the pending connection would keep the
        // listener readable and poll() spinning. Take it with the spare
        // descriptor and close it: that client sees a reset, the others
        // are served.
        spareFd.reset();
        int taken = ::accept4(listenFd.get(), nullptr, nullptr, SOCK_CLOEXEC);
        if (taken >= 0) ::close(taken);
        spareFd = Fd(::open("/dev/null", O_RDONLY | O_CLOEXEC));
        // accept4 fails with EMFILE before it looks at the queue: with
        // nothing pending, retrying would loop here for ever.
        if (taken < 0) return;
        warn("out of file descriptors: refused a client ({} connected)", clients.size());
        continue;
      }
      return;
    }
    if (clients.size() >= maxClients && !evictOneUnproven()) {
      ::close(fd);
      warn("refusing a client beyond {} connections", maxClients);
      continue;
    }
    net::setNoDelay(fd);
    Client& c = clients[nextClientId++];
    ++connections;
    c.fd = Fd(fd);
    if (!authKey.empty()) c.auth = Client::Auth::AwaitHello;
    c.lastInput = c.connected = Clock::now();
  }
}

void TCPStoreServer::State::drop(std::map<uint64_t, Client>::iterator it) {
  if (it->second.blocked) unblock(it->first, it->second);
  inputHeld -= it->second.in.size();
  outputHeld -= it->second.backlog();
  clients.erase(it);
}

// Makes room for a new connection when descriptors or client slots run
// out: closes the oldest connection that has not proved itself (with a
// key: not authenticated yet; without: never sent a byte, for
// kQuietEvictAge), so idle sockets cannot lock the ranks out. False: none.
bool TCPStoreServer::State::evictOneUnproven() {
  const auto now = Clock::now();
  for (auto it = clients.begin(); it != clients.end(); ++it) {  // ids grow: oldest first
    const Client& c = it->second;
    const bool unproven = authKey.empty() ? !c.spoke && now - c.connected > kQuietEvictAge
                                          : c.auth != Client::Auth::Open;
    if (!unproven) continue;
    warn("closing an idle connection that {} to make room for a new one ({} connected)",
         authKey.empty() ? "never sent anything" : "never authenticated", clients.size());
    drop(it);
    return true;
  }
  return false;
}

// One client's turn: read, run, reply. Whatever goes wrong with it (a
// malformed frame, an allocation that fails) drops that client only.
bool TCPStoreServer::State::serve(uint64_t id, Client& c, short revents) {
  try {
    const bool backlogged = c.backlog() > kOutputHighWater;
    if (!backlogged && (revents & (POLLIN | POLLHUP | POLLERR)) && !readFrom(c)) return false;
    // Requests held back while replies piled up run once they drained:
    // nothing else would wake this client (it sent them all already).
    while (true) {
      const size_t inBefore = c.in.size(), outBefore = c.backlog();
      if (!process(id, c) || !flush(c)) return false;
      if (c.blocked || c.in.empty() || c.backlog() > kOutputHighWater) break;
      if (c.in.size() == inBefore && c.backlog() >= outBefore) break;  // a partial frame
    }
    return true;
  } catch (const std::exception& e) {
    warn("dropping a client: {}", e.what());
    return false;
  }
}

// Drops clients that sat on an unfinished frame too long, and (with a
// key) those that did not authenticate within the deadline.
void TCPStoreServer::State::expireIdle() {
  auto now = Clock::now();
  for (auto it = clients.begin(); it != clients.end();) {
    Client& c = it->second;
    if (c.auth != Client::Auth::Open && now - c.connected > limits.authDeadline) {
      warn("dropping a client that did not authenticate within {} ms", limits.authDeadline.count());
      auto gone = it++;
      drop(gone);
    } else if (!c.in.empty() && now - c.lastInput > limits.partialFrameIdle) {
      warn("dropping a client that sent {} bytes of a frame and nothing for {} ms", c.in.size(),
           limits.partialFrameIdle.count());
      auto gone = it++;
      drop(gone);
    } else {
      ++it;
    }
  }
}

void TCPStoreServer::State::run(const std::stop_token& stop) {
  spareFd = Fd(::open("/dev/null", O_RDONLY | O_CLOEXEC));
  std::vector<pollfd> fds;
  std::vector<uint64_t> ids;
  auto lastExpiry = Clock::now();
  while (!stop.stop_requested()) {
    fds.assign({{wakeFd.get(), POLLIN, 0}, {listenFd.get(), POLLIN, 0}});
    ids.clear();
    bool unauthenticated = false;
    for (auto& [id, c] : clients) {
      unauthenticated = unauthenticated || c.auth != Client::Auth::Open;
      const bool backlogged = c.backlog() > kOutputHighWater;
      fds.push_back({c.fd.get(),
                     static_cast<short>((backlogged ? 0 : POLLIN) | (c.backlog() ? POLLOUT : 0)),
                     0});
      ids.push_back(id);
    }
    // Partial frames expire: looked at every second, or sooner.
    const auto expiryCheck = std::min<std::chrono::milliseconds>(
        {std::chrono::seconds(1), limits.partialFrameIdle, limits.authDeadline});
    const bool expiring = inputHeld > 0 || unauthenticated;
    const int pollMs = expiring ? static_cast<int>(expiryCheck.count()) : -1;
    if (::poll(fds.data(), fds.size(), pollMs) < 0) {
      if (errno == EINTR) continue;
      log(LogLevel::Error, "store server: poll failed: {}", std::strerror(errno));
      return;
    }
    if (fds[0].revents != 0) return;
    if (fds[1].revents & POLLIN) acceptAll();
    for (size_t i = 0; i < ids.size(); ++i) {
      auto it = clients.find(ids[i]);
      if (it == clients.end()) continue;
      if (!serve(it->first, it->second, fds[i + 2].revents)) drop(it);
    }
    // New keys may release clients blocked in Get/Wait (and their replies
    // may be mutations that release others).
    while (!woken.empty()) {
      std::vector<uint64_t> now;
      now.swap(woken);
      std::sort(now.begin(), now.end());
      now.erase(std::unique(now.begin(), now.end()), now.end());
      for (uint64_t id : now) {
        auto it = clients.find(id);
        if (it == clients.end() || !it->second.blocked) continue;
        if (!serve(id, it->second, 0)) drop(it);
      }
    }
    // Replies that waited for room in the output budget, once it drained.
    if (!awaitingRoom.empty() && outputHeld < limits.memoryBudget) {
      std::vector<uint64_t> now;
      now.swap(awaitingRoom);
      for (uint64_t id : now) {
        auto it = clients.find(id);
        if (it == clients.end()) continue;
        it->second.awaitsRoom = false;
        if (!serve(id, it->second, 0)) drop(it);
      }
    }
    if (expiring && Clock::now() - lastExpiry > expiryCheck) {
      expireIdle();
      lastExpiry = Clock::now();
    }
  }
}

TCPStoreServer::TCPStoreServer(const std::string& host, uint16_t port, std::string authKey,
                               Limits limits)
    : state_(std::make_unique<State>()) {
  state_->authKey = std::move(authKey);
  state_->limits = limits;
  if (limits.maxClients > 0) state_->maxClients = std::min(state_->maxClients, limits.maxClients);
  state_->listenFd = net::listenTcp(host, port);
  net::setNonBlocking(state_->listenFd.get());
  state_->port = net::localPort(state_->listenFd.get());
  state_->wakeFd = Fd(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!state_->wakeFd)
    throw errnoError(ErrorKind::Store, "eventfd", errno, "starting the store server");
  state_->thread = std::jthread([s = state_.get()](std::stop_token st) { s->run(st); });
}

TCPStoreServer::~TCPStoreServer() {
  state_->thread.request_stop();
  uint64_t one = 1;
  ssize_t ignored = ::write(state_->wakeFd.get(), &one, sizeof one);
  (void)ignored;
  if (state_->thread.joinable()) state_->thread.join();
  const auto& n = state_->requests;
  uint64_t total = 0;
  for (uint64_t v : n) total += v;
  log(LogLevel::Debug,
      "store server: served {} requests from {} connections (set {}, get {}, add {}, check {}, "
      "wait {}, delete {}, multiGet {})",
      total, state_->connections, n[0], n[1], n[2], n[3], n[4], n[5], n[6]);
}

uint16_t TCPStoreServer::port() const noexcept {
  return state_->port;
}

}  // namespace rdmacc
