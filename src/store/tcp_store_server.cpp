// The TCP store server (TCPStoreServer): one thread, any number of clients,
// each served inside its own error handler; the client is store/tcp_store.cpp.
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
#include "src/store/auth.hpp"
#include "src/store/protocol.hpp"
#include "src/store/socket.hpp"
#include "src/store/store_util.hpp"

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
// At most one warning per this interval for misbehaving clients.
constexpr auto kWarnInterval = std::chrono::seconds(10);

// Without a key, a connection that never sent a byte for this long may be
// closed to make room for a new one when descriptors run out.
constexpr auto kQuietEvictAge = std::chrono::seconds(1);

// Raises the soft descriptor limit to the hard one (the store may serve
// thousands of ranks; the default soft limit is often 1024), then returns
// how many clients to serve at most.
size_t clientLimit() {
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
    size_t outSent = 0;       // bytes of `out` already sent: sending erases nothing
    bool blocked = false;     // a Get/Wait waits for keys; later input is held back
    bool spoke = false;       // sent a byte since it connected
    bool awaitsRoom = false;  // a reply waits for room in the output budget
    Clock::time_point connected{};
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
  Limits limits;
  size_t maxClients = clientLimit();
  size_t inputHeld = 0;                // sum of the clients' `in`
  size_t storedBytes = 0;              // keys and values in `data`
  size_t outputHeld = 0;               // sum of the clients' backlog()
  std::vector<uint64_t> awaitingRoom;  // clients whose reply waits for outputHeld to drop
  std::map<std::string, Bytes> data;
  std::map<uint64_t, Client> clients;
  // Blocked clients by a key they wait for: a mutation of a key looks at its
  // waiters only, not at every blocked client and every key it waits for.
  std::multimap<std::string, uint64_t> waiters;
  std::vector<uint64_t> woken;
  // Requests served, by command (Command - 1): the summary at shutdown is how
  // a test holds the number of requests a group's formation costs.
  std::array<uint64_t, sp::kCommands> requests{};
  uint64_t connections = 0;
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

  enum class Outcome { Done, NeedKeys, NeedRoom };

  // The bytes a Get or MultiGet reply holds (keys present), else 0.
  size_t replyBytes(const sp::Request& req) const {
    if (req.command != sp::Command::Get && req.command != sp::Command::MultiGet) return 0;
    size_t total = 0;
    for (const auto& k : req.keys) {
      auto it = data.find(k);
      if (it != data.end()) total += 4 + it->second.size();
    }
    return total;
  }

  Outcome execute(const sp::Request& req, Client& c) {
    if (!ready(req)) {
      if (req.command == sp::Command::Get || req.command == sp::Command::Wait ||
          req.command == sp::Command::MultiGet) {
        return Outcome::NeedKeys;
      }
    }
    // Replies wait while those of other clients hold the budget; one that
    // is alone may exceed it (a value can be as large as the protocol allows).
    if (const size_t reply = replyBytes(req);
        reply > 0 && outputHeld > 0 && outputHeld + reply > limits.memoryBudget) {
      return Outcome::NeedRoom;
    }
    sp::Response resp;
    auto refuse = [&](std::string why) {
      resp.status = sp::Status::Error;
      resp.error = std::move(why);
    };
    // Room for `bytes` more stored bytes, or an error reply naming the budget.
    auto fits = [&](size_t freed, size_t added) {
      if (storedBytes - freed + added <= limits.memoryBudget) return true;
      refuse(
          fmt::format("the store is full: it holds {} bytes and its budget is {} "
                      "(RDMACC_STORE_MEMORY of the process hosting it); {} more do not fit",
                      storedBytes, limits.memoryBudget, added - std::min(added, freed)));
      return false;
    };
    switch (req.command) {
      case sp::Command::Set: {
        auto it = data.find(req.keys[0]);
        const size_t freed = it == data.end() ? 0 : req.keys[0].size() + it->second.size();
        const size_t added = req.keys[0].size() + req.value.size();
        if (!fits(freed, added)) break;
        data[req.keys[0]] = req.value;
        storedBytes = storedBytes - freed + added;
        break;
      }
      case sp::Command::Get:
        resp.value = data[req.keys[0]];
        break;
      case sp::Command::Add: {
        auto it = data.find(req.keys[0]);
        const size_t freed = it == data.end() ? 0 : req.keys[0].size() + it->second.size();
        int64_t v = 0;
        try {
          v = counterAdd(it == data.end() ? nullptr : &it->second, req.delta, req.keys[0]);
        } catch (const Error& e) {
          refuse(e.info().message);
          break;
        }
        std::string text = std::to_string(v);
        if (!fits(freed, req.keys[0].size() + text.size())) break;
        data[req.keys[0]] = Bytes(text.begin(), text.end());
        storedBytes = storedBytes - freed + req.keys[0].size() + text.size();
        sp::putI64(resp.value, v);
        break;
      }
      case sp::Command::Check:
        resp.value.push_back(ready(req) ? 1 : 0);
        break;
      case sp::Command::Wait:
        break;
      case sp::Command::Delete: {
        auto it = data.find(req.keys[0]);
        const bool existed = it != data.end();
        if (existed) {
          storedBytes -= req.keys[0].size() + it->second.size();
          data.erase(it);
        }
        resp.value.push_back(existed ? 1 : 0);
        break;
      }
      case sp::Command::MultiGet: {
        size_t total = 0;
        for (const auto& k : req.keys) total += 4 + data[k].size();
        if (total > sp::kMaxValueBytes) {
          refuse(fmt::format("multiGet of {} keys would return {} bytes (the limit is {})",
                             req.keys.size(), total, sp::kMaxValueBytes));
          break;
        }
        resp.value.reserve(total);
        for (const auto& k : req.keys) {
          const Bytes& v = data[k];
          sp::putU32(resp.value, static_cast<uint32_t>(v.size()));
          resp.value.insert(resp.value.end(), v.begin(), v.end());
        }
        break;
      }
    }
    queue(c, sp::encode(resp));
    return Outcome::Done;
  }

  // Every reply goes out through here: outputHeld is the sum of backlogs.
  void queue(Client& c, const std::vector<uint8_t>& frame) {
    c.out.insert(c.out.end(), frame.begin(), frame.end());
    outputHeld += frame.size();
  }

  void awaitRoom(uint64_t id, Client& c) {
    if (!c.awaitsRoom) awaitingRoom.push_back(id);
    c.awaitsRoom = true;
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
  // (store/protocol.hpp); consumes its frames from c.in at offset. False:
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

  bool flush(Client& c) {
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

  bool readFrom(Client& c) {
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

  void drop(std::map<uint64_t, Client>::iterator it) {
    if (it->second.blocked) unblock(it->first, it->second);
    inputHeld -= it->second.in.size();
    outputHeld -= it->second.backlog();
    clients.erase(it);
  }

  // Makes room for a new connection when descriptors or client slots run
  // out: closes the oldest connection that has not proved itself (with a
  // key: not authenticated yet; without: never sent a byte, for
  // kQuietEvictAge), so idle sockets cannot lock the ranks out. False: none.
  bool evictOneUnproven() {
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

  // Drops clients that sat on an unfinished frame too long, and (with a
  // key) those that did not authenticate within the deadline.
  void expireIdle() {
    auto now = Clock::now();
    for (auto it = clients.begin(); it != clients.end();) {
      Client& c = it->second;
      if (c.auth != Client::Auth::Open && now - c.connected > limits.authDeadline) {
        warn("dropping a client that did not authenticate within {} ms",
             limits.authDeadline.count());
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

  void run(const std::stop_token& stop) {
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
};

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
