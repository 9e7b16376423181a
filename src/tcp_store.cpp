#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <map>
#include <mutex>
#include <thread>

#include <fmt/format.h>

#include "rdmacc/error.hpp"
#include "rdmacc/log.hpp"
#include "rdmacc/store.hpp"
#include "src/auth.hpp"
#include "src/socket.hpp"
#include "src/store_protocol.hpp"
#include "src/store_util.hpp"

namespace rdmacc {
namespace sp = store_protocol;
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
// Bytes held for partial frames across all clients, and how long one client
// may sit on an unfinished frame without sending more of it.
constexpr size_t kInputBudget = 1u << 30;
constexpr auto kPartialFrameIdle = std::chrono::seconds(60);
// At most one warning per this interval for misbehaving clients.
constexpr auto kWarnInterval = std::chrono::seconds(10);

size_t clientLimit() {
  rlimit rl{};
  if (::getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY) return kMaxClients;
  const auto cur = static_cast<size_t>(rl.rlim_cur);
  return cur <= kReservedFds * 2 ? cur / 2 : std::min(kMaxClients, cur - kReservedFds);
}

}  // namespace

// ----------------------------------------------------------------- server --

// Threading: all members but the eventfd belong to the server thread; the
// destructor writes the eventfd and joins.
struct TCPStoreServer::State {
  struct Client {
    // With a key, a client must authenticate before its first request.
    enum class Auth : uint8_t { Open, AwaitHello, AwaitProof };
    Auth auth = Auth::Open;
    auth::Nonce clientNonce{}, serverNonce{};
    Fd fd;
    std::vector<uint8_t> in;
    std::vector<uint8_t> out;
    size_t outSent = 0;    // bytes of `out` already sent: sending erases nothing
    bool blocked = false;  // a Get/Wait waits for keys; later input is held back
    sp::Request pending;
    size_t present = 0;  // blocked: pending.keys[0, present) were there at the last look
    Clock::time_point lastInput{};
    size_t backlog() const { return out.size() - outSent; }
  };

  Fd listenFd;
  Fd wakeFd;
  Fd spareFd;  // closed to accept-and-close a client when descriptors run out
  uint16_t port = 0;
  std::string authKey;  // RDMACC_AUTH_KEY; empty: no authentication
  size_t maxClients = clientLimit();
  size_t inputHeld = 0;  // sum of the clients' `in`
  std::map<std::string, Bytes> data;
  std::map<uint64_t, Client> clients;
  // Blocked clients by a key they wait for: a mutation of a key looks at its
  // waiters only, not at every blocked client and every key it waits for.
  std::multimap<std::string, uint64_t> waiters;
  std::vector<uint64_t> woken;
  uint64_t nextClientId = 1;
  Clock::time_point lastWarning{};
  size_t warningsHeld = 0;
  std::jthread thread;  // last: started after everything above exists

  template <typename... Args>
  void warn(fmt::format_string<Args...> format, Args&&... args) {
    auto now = Clock::now();
    if (now - lastWarning < kWarnInterval) {
      ++warningsHeld;
      return;
    }
    std::string text = fmt::format(format, std::forward<Args>(args)...);
    if (warningsHeld > 0) text += fmt::format(" ({} similar warnings held back)", warningsHeld);
    log(LogLevel::Warn, "store server: {}", text);
    lastWarning = now;
    warningsHeld = 0;
  }

  // Whether every key of a blocked request is there; resumes where the last
  // look stopped (keys before `present` were there, and a Delete of one of
  // them resets it), so a Wait on n keys costs O(n) over all mutations.
  bool ready(const sp::Request& req, size_t& present) const {
    while (present < req.keys.size() && data.contains(req.keys[present])) ++present;
    return present == req.keys.size();
  }
  bool ready(const sp::Request& req) const {
    size_t present = 0;
    return ready(req, present);
  }

  // Returns false when the request must wait for keys.
  bool execute(const sp::Request& req, Client& c) {
    sp::Response resp;
    switch (req.command) {
      case sp::Command::Set:
        data[req.keys[0]] = req.value;
        break;
      case sp::Command::Get:
        if (!ready(req)) return false;
        resp.value = data[req.keys[0]];
        break;
      case sp::Command::Add: {
        auto it = data.find(req.keys[0]);
        int64_t v = 0;
        try {
          v = counterAdd(it == data.end() ? nullptr : &it->second, req.delta, req.keys[0]);
        } catch (const Error& e) {
          resp.status = sp::Status::Error;
          resp.error = e.info().message;
          break;
        }
        std::string text = std::to_string(v);
        data[req.keys[0]] = Bytes(text.begin(), text.end());
        sp::putI64(resp.value, v);
        break;
      }
      case sp::Command::Check:
        resp.value.push_back(ready(req) ? 1 : 0);
        break;
      case sp::Command::Wait:
        if (!ready(req)) return false;
        break;
      case sp::Command::Delete:
        resp.value.push_back(data.erase(req.keys[0]) > 0 ? 1 : 0);
        break;
    }
    auto frame = sp::encode(resp);
    c.out.insert(c.out.end(), frame.begin(), frame.end());
    return true;
  }

  void block(uint64_t id, Client& c, sp::Request req) {
    c.blocked = true;
    c.pending = std::move(req);
    c.present = 0;
    ready(c.pending, c.present);
    for (const auto& k : c.pending.keys) waiters.emplace(k, id);
  }

  void unblock(uint64_t id, Client& c) {
    for (const auto& k : c.pending.keys) {
      auto [lo, hi] = waiters.equal_range(k);
      for (auto it = lo; it != hi; ++it) {
        if (it->second == id) {
          waiters.erase(it);
          break;
        }
      }
    }
    c.blocked = false;
    c.pending = sp::Request{};
  }

  // After a mutation of `key`: the clients waiting for it look again.
  void mutated(const std::string& key, bool deleted) {
    auto [lo, hi] = waiters.equal_range(key);
    for (auto it = lo; it != hi; ++it) {
      auto c = clients.find(it->second);
      if (c == clients.end()) continue;
      if (deleted) c->second.present = 0;
      woken.push_back(it->second);
    }
  }

  // The challenge-response of a client that has not authenticated yet
  // (store_protocol.hpp); consumes its frames from c.in at offset. False:
  // drop it (told why, when it sent a request instead).
  bool authenticate(Client& c, size_t& offset) {
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
        ssize_t ignored =
            ::send(c.fd.get(), frame.data(), frame.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
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
        auto frame = sp::encode(challenge);
        c.out.insert(c.out.end(), frame.begin(), frame.end());
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
  bool process(uint64_t id, Client& c) {
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
      if (!ready(c.pending, c.present) || !execute(c.pending, c)) return true;
      unblock(id, c);
    }
    while (!c.blocked && c.backlog() <= kOutputHighWater) {
      sp::Request req;
      auto r = sp::decode(c.in.data() + offset, c.in.size() - offset, req);
      if (r.state == sp::Decode::NeedMore) break;
      if (r.state == sp::Decode::Malformed) {
        log(LogLevel::Warn, "store server: dropping a client that sent a malformed frame ({})",
            r.reason);
        return false;
      }
      offset += r.consumed;
      if (req.command == sp::Command::Set || req.command == sp::Command::Add ||
          req.command == sp::Command::Delete) {
        mutated(req.keys[0], req.command == sp::Command::Delete);
      }
      if (!execute(req, c)) block(id, c, std::move(req));
    }
    inputHeld -= offset;
    c.in.erase(c.in.begin(), c.in.begin() + static_cast<ptrdiff_t>(offset));
    return true;
  }

  bool flush(Client& c) {
    while (c.backlog() > 0) {
      ssize_t n =
          ::send(c.fd.get(), c.out.data() + c.outSent, c.backlog(), MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n > 0) {
        c.outSent += static_cast<size_t>(n);
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

  bool readFrom(Client& c) {
    uint8_t buf[65536];
    while (true) {
      ssize_t n = ::recv(c.fd.get(), buf, sizeof buf, MSG_DONTWAIT);
      if (n > 0) {
        c.in.insert(c.in.end(), buf, buf + n);
        inputHeld += static_cast<size_t>(n);
        c.lastInput = Clock::now();
        // A blocked client may not pile up unbounded input, nor all of them
        // together more than the budget.
        if (c.in.size() > sp::kMaxFrameBytes + 8) {
          warn("dropping a client that sent {} bytes it has not waited for", c.in.size());
          return false;
        }
        if (inputHeld > kInputBudget) {
          warn("dropping a client: {} bytes of unfinished requests held for all clients",
               inputHeld);
          return false;
        }
        continue;
      }
      if (n == 0) return false;
      return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR;
    }
  }

  void acceptAll() {
    while (true) {
      int fd = ::accept4(listenFd.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) {
        if ((errno == EMFILE || errno == ENFILE) && spareFd) {
          // Out of descriptors: the pending connection would keep the
          // listener readable and poll() spinning. Take it with the spare
          // descriptor and close it: that client sees a reset, the others
          // are served.
          spareFd.reset();
          int taken = ::accept4(listenFd.get(), nullptr, nullptr, SOCK_CLOEXEC);
          if (taken >= 0) ::close(taken);
          spareFd = Fd(::open("/dev/null", O_RDONLY | O_CLOEXEC));
          warn("out of file descriptors: refused a client ({} connected)", clients.size());
          continue;
        }
        return;
      }
      if (clients.size() >= maxClients) {
        ::close(fd);
        warn("refusing a client beyond {} connections", maxClients);
        continue;
      }
      net::setNoDelay(fd);
      Client& c = clients[nextClientId++];
      c.fd = Fd(fd);
      if (!authKey.empty()) c.auth = Client::Auth::AwaitHello;
      c.lastInput = Clock::now();
    }
  }

  void drop(std::map<uint64_t, Client>::iterator it) {
    if (it->second.blocked) unblock(it->first, it->second);
    inputHeld -= it->second.in.size();
    clients.erase(it);
  }

  // One client's turn: read, run, reply. Whatever goes wrong with it (a
  // malformed frame, an allocation that fails) drops that client only.
  bool serve(uint64_t id, Client& c, short revents) {
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

  // Drops clients that sat on an unfinished frame too long.
  void expireIdle() {
    auto now = Clock::now();
    for (auto it = clients.begin(); it != clients.end();) {
      Client& c = it->second;
      if (!c.in.empty() && now - c.lastInput > kPartialFrameIdle) {
        warn("dropping a client that sent {} bytes of a frame and nothing for {} s", c.in.size(),
             std::chrono::duration_cast<std::chrono::seconds>(kPartialFrameIdle).count());
        auto gone = it++;
        drop(gone);
      } else {
        ++it;
      }
    }
  }

  void run(const std::stop_token& stop) {
    spareFd = Fd(::open("/dev/null", O_RDONLY | O_CLOEXEC));
    std::vector<pollfd> fds;
    std::vector<uint64_t> ids;
    auto lastExpiry = Clock::now();
    while (!stop.stop_requested()) {
      fds.assign({{wakeFd.get(), POLLIN, 0}, {listenFd.get(), POLLIN, 0}});
      ids.clear();
      for (auto& [id, c] : clients) {
        const bool backlogged = c.backlog() > kOutputHighWater;
        fds.push_back({c.fd.get(),
                       static_cast<short>((backlogged ? 0 : POLLIN) | (c.backlog() ? POLLOUT : 0)),
                       0});
        ids.push_back(id);
      }
      const int pollMs = inputHeld > 0 ? 1000 : -1;  // partial frames expire
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
      if (inputHeld > 0 && Clock::now() - lastExpiry > std::chrono::seconds(1)) {
        expireIdle();
        lastExpiry = Clock::now();
      }
    }
  }
};

TCPStoreServer::TCPStoreServer(const std::string& host, uint16_t port, std::string authKey)
    : state_(std::make_unique<State>()) {
  state_->authKey = std::move(authKey);
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
}

uint16_t TCPStoreServer::port() const noexcept {
  return state_->port;
}

// ----------------------------------------------------------------- client --

// Threading: a pool of connections. A call takes an idle one (or opens
// one) and returns it when done, so a thread blocked in get() or wait() never
// holds up another thread's set() (which may be what it waits for), as with
// c10d's TCPStore used from several threads. A connection whose call failed
// or timed out is closed, not returned: a late reply must not be read as the
// answer to the next request.
struct TCPStore::State {
  std::string host;
  uint16_t port;
  TCPStoreOptions options;
  std::unique_ptr<TCPStoreServer> server;
  std::mutex mutex;      // guards idle
  std::vector<Fd> idle;  // connections no call is using
  static constexpr size_t kMaxIdle = 8;

  // A connection for one call: an idle one, or a new one.
  Fd take() {
    {
      std::lock_guard lock(mutex);
      if (!idle.empty()) {
        Fd fd = std::move(idle.back());
        idle.pop_back();
        return fd;
      }
    }
    return connect(Clock::now() + options.connectTimeout);
  }
  void giveBack(Fd fd) {
    std::lock_guard lock(mutex);
    if (idle.size() < kMaxIdle) idle.push_back(std::move(fd));
  }

  std::string where() const { return fmt::format("{}:{}", host, port); }

  Fd connect(Clock::time_point deadline) {
    int errnum = 0;
    std::string detail;
    auto delay = std::chrono::milliseconds(10);
    while (true) {
      Fd fd = net::tryConnectTcp(host, port, deadline, errnum, detail);
      if (fd) {
        if (!options.authKey.empty()) authenticate(fd, deadline);
        return fd;
      }
      if (Clock::now() + delay > deadline) break;
      std::this_thread::sleep_for(delay);
      delay = std::min(delay * 2, std::chrono::milliseconds(500));
    }
    throw Error(ErrorInfo{
        .kind = ErrorKind::Store,
        .message = fmt::format("cannot reach the store at {} within {} ms", where(),
                               options.connectTimeout.count()),
        .call = "connect",
        .errnum = errnum,
        .status = detail,
        .peerAddress = where(),
        .hint = "check MASTER_ADDR/MASTER_PORT and that rank 0 (or the launcher) is running"});
  }

  // The client's side of the challenge-response (store_protocol.hpp): it
  // also checks that the server holds the key before sending it anything.
  void authenticate(Fd& fd, Clock::time_point deadline) {
    auto fail = [&](const std::string& what, const std::string& hint) {
      fd.reset();
      throw Error(ErrorInfo{.kind = ErrorKind::Store,
                            .message = fmt::format("store at {}: {}", where(), what),
                            .peerAddress = where(),
                            .hint = hint});
    };
    const std::string sameKey =
        "set the same RDMACC_AUTH_KEY (or RDMACC_AUTH_KEY_FILE) on every rank and on the "
        "process hosting the store, or on none";
    const auth::Nonce mine = auth::nonce();
    sp::AuthFrame hello{.tag = sp::AuthTag::Hello};
    hello.body.assign(mine.begin(), mine.end());
    std::vector<uint8_t> reply(4 + 1 + sp::kMaxAuthBodyBytes);
    size_t got = 0;
    sp::AuthFrame challenge;
    try {
      auto frame = sp::encode(hello);
      if (!net::sendAll(fd.get(), frame.data(), frame.size(), deadline)) {
        fail("no room to send the authentication hello in time", sameKey);
      }
      while (true) {
        const auto r = sp::decode(reply.data(), got, challenge);
        if (r.state == sp::Decode::Ok) break;
        if (r.state == sp::Decode::Malformed || got == reply.size()) {
          fail(fmt::format("answered the authentication hello with something else ({})", r.reason),
               "is MASTER_PORT an rdmacc store? " + sameKey);
        }
        if (!net::recvAll(fd.get(), reply.data() + got, 1, deadline)) {
          fail("did not answer the authentication hello in time", sameKey);
        }
        ++got;
      }
    } catch (const Error& e) {
      if (!fd) throw;  // fail() above
      fail(fmt::format("closed the connection during authentication ({}): it runs without a "
                       "key, or with another one",
                       e.info().message),
           sameKey);
    }
    if (challenge.tag != sp::AuthTag::Challenge ||
        challenge.body.size() != auth::kNonceBytes + auth::kMacBytes) {
      fail("sent a malformed authentication challenge", sameKey);
    }
    auth::Nonce theirs{};
    std::copy_n(challenge.body.begin(), theirs.size(), theirs.begin());
    const auth::Mac expected = auth::mac(options.authKey, "rdmacc store server", mine, theirs);
    if (!auth::same(expected, challenge.body.data() + auth::kNonceBytes)) {
      fail("does not hold this process's key (its proof is wrong)", sameKey);
    }
    const auth::Mac proof = auth::mac(options.authKey, "rdmacc store client", theirs, mine);
    sp::AuthFrame answer{.tag = sp::AuthTag::Proof};
    answer.body.assign(proof.begin(), proof.end());
    auto frame = sp::encode(answer);
    if (!net::sendAll(fd.get(), frame.data(), frame.size(), deadline)) {
      fail("no room to send the authentication proof in time", sameKey);
    }
  }

  // Sends one request and waits for its response until the deadline; returns
  // false on timeout (the connection is then dropped: a late reply must not be
  // read as the answer to the next request).
  bool roundTrip(Fd& fd, const sp::Request& req, sp::Response& resp, Clock::time_point deadline) {
    try {
      auto frame = sp::encode(req);
      if (!net::sendAll(fd.get(), frame.data(), frame.size(), deadline)) {
        fd.reset();
        return false;
      }
      uint8_t header[4];
      if (!net::recvAll(fd.get(), header, 4, deadline)) {
        fd.reset();
        return false;
      }
      uint32_t len = sp::getU32(header);
      if (len == 0 || len > sp::kMaxFrameBytes) {
        throw Error(ErrorKind::Protocol,
                    fmt::format("store at {} sent a frame of {} bytes", where(), len),
                    "is MASTER_PORT really an rdmacc store?");
      }
      std::vector<uint8_t> buf(4 + static_cast<size_t>(len));
      std::copy(header, header + 4, buf.begin());
      if (!net::recvAll(fd.get(), buf.data() + 4, len, deadline)) {
        fd.reset();
        return false;
      }
      auto r = sp::decode(buf.data(), buf.size(), resp);
      if (r.state != sp::Decode::Ok) {
        throw Error(ErrorKind::Protocol,
                    fmt::format("malformed reply from the store at {}: {}", where(), r.reason));
      }
    } catch (const Error& e) {
      fd.reset();
      if (e.kind() != ErrorKind::Store) throw;
      ErrorInfo info = e.info();
      info.message =
          fmt::format("lost the connection to the store at {}: {}", where(), info.message);
      info.peerAddress = where();
      info.hint = "the process hosting the store (rank 0 or the launcher) may have exited";
      throw Error(std::move(info));
    }
    if (resp.status == sp::Status::Error) {
      throw Error(ErrorKind::Store, fmt::format("store at {}: {}", where(), resp.error));
    }
    return true;
  }

  sp::Response call(sp::Request req, std::chrono::milliseconds timeout, const char* what) {
    Fd fd = take();
    sp::Response resp;
    if (roundTrip(fd, req, resp, Clock::now() + timeout)) {
      if (fd) giveBack(std::move(fd));
      return resp;
    }
    // Which keys are missing, for the error: one check per key, all within
    // one short budget, and none after the server stopped answering (a mute
    // server used to cost 5 s per key on top of the timeout).
    std::vector<std::string> missing;
    if (req.command == sp::Command::Get || req.command == sp::Command::Wait) {
      const auto diagnosis =
          Clock::now() + std::min<Clock::duration>(timeout, std::chrono::seconds(1));
      Fd check;
      try {
        check = connect(diagnosis);
      } catch (const Error&) {
      }
      for (const auto& k : req.keys) {
        sp::Response r;
        if (!check || !roundTrip(check, sp::Request{.command = sp::Command::Check, .keys = {k}}, r,
                                 diagnosis)) {
          break;
        }
        if (!r.value.empty() && r.value[0] == 0) missing.push_back(k);
      }
    }
    if (!missing.empty()) throw storeTimeout(what, missing, timeout, "store at " + where());
    throw Error(ErrorInfo{.kind = ErrorKind::Timeout,
                          .message = fmt::format("store {} timed out after {} ms (store at {})",
                                                 what, timeout.count(), where()),
                          .peerAddress = where(),
                          .hint = "the process hosting the store may be overloaded or stopped"});
  }
};

TCPStore::TCPStore(std::string host, uint16_t port, TCPStoreOptions options)
    : Store(options.timeout), state_(std::make_unique<State>()) {
  state_->host = std::move(host);
  state_->port = port;
  state_->options = options;
  if (options.isServer) {
    std::string why;
    const std::string bind = net::storeBindAddress(state_->host, why);
    log(LogLevel::Info, "store server on {}:{}: {}", bind, port, why);
    state_->server = std::make_unique<TCPStoreServer>(bind, port, options.authKey);
    state_->port = state_->server->port();
  }
  // Connect now: a wrong address or key fails here, not at the first call.
  state_->giveBack(state_->connect(Clock::now() + options.connectTimeout));
}

TCPStore::~TCPStore() = default;

uint16_t TCPStore::port() const noexcept {
  return state_->port;
}

void TCPStore::set(const std::string& key, const Bytes& value) {
  state_->call({.command = sp::Command::Set, .keys = {key}, .value = value}, timeout(), "set");
}

Bytes TCPStore::get(const std::string& key) {
  return state_->call({.command = sp::Command::Get, .keys = {key}}, timeout(), "get").value;
}

int64_t TCPStore::add(const std::string& key, int64_t delta) {
  auto r =
      state_->call({.command = sp::Command::Add, .keys = {key}, .delta = delta}, timeout(), "add");
  if (r.value.size() != 8) throw Error(ErrorKind::Protocol, "store add() reply has the wrong size");
  return sp::getI64(r.value.data());
}

bool TCPStore::check(const std::vector<std::string>& keys) {
  auto r = state_->call({.command = sp::Command::Check, .keys = keys}, timeout(), "check");
  return !r.value.empty() && r.value[0] != 0;
}

void TCPStore::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  state_->call({.command = sp::Command::Wait, .keys = keys}, timeout, "wait");
}

bool TCPStore::deleteKey(const std::string& key) {
  auto r = state_->call({.command = sp::Command::Delete, .keys = {key}}, timeout(), "deleteKey");
  return !r.value.empty() && r.value[0] != 0;
}

}  // namespace rdmacc
