#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <map>
#include <mutex>
#include <thread>

#include <fmt/format.h>

#include "rdmacc/error.hpp"
#include "rdmacc/log.hpp"
#include "rdmacc/store.hpp"
#include "src/socket.hpp"
#include "src/store_protocol.hpp"
#include "src/store_util.hpp"

namespace rdmacc {
namespace sp = store_protocol;
using net::Clock;
using net::Fd;

namespace {

constexpr size_t kMaxClients = 16384;

}  // namespace

// ----------------------------------------------------------------- server --

// Threading: all members but the eventfd belong to the server thread; the
// destructor writes the eventfd and joins.
struct TCPStoreServer::State {
  struct Client {
    Fd fd;
    std::vector<uint8_t> in;
    std::vector<uint8_t> out;
    bool blocked = false;  // a Get/Wait waits for keys; later input is held back
    sp::Request pending;
  };

  Fd listenFd;
  Fd wakeFd;
  uint16_t port = 0;
  std::map<std::string, Bytes> data;
  std::map<uint64_t, Client> clients;
  uint64_t nextClientId = 1;
  std::jthread thread;  // last: started after everything above exists

  bool ready(const sp::Request& req) const { return missingKeys(data, req.keys).empty(); }

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

  // Decodes and runs the client's queued frames; false if it must be dropped.
  bool process(Client& c, bool& mutated) {
    if (c.blocked) {
      if (!execute(c.pending, c)) return true;
      c.blocked = false;
    }
    size_t offset = 0;
    while (!c.blocked) {
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
        mutated = true;
      }
      if (!execute(req, c)) {
        c.blocked = true;
        c.pending = std::move(req);
      }
    }
    c.in.erase(c.in.begin(), c.in.begin() + static_cast<ptrdiff_t>(offset));
    return true;
  }

  bool flush(Client& c) {
    while (!c.out.empty()) {
      ssize_t n = ::send(c.fd.get(), c.out.data(), c.out.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n > 0) {
        c.out.erase(c.out.begin(), c.out.begin() + n);
        continue;
      }
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return true;
      return false;
    }
    return true;
  }

  bool readFrom(Client& c) {
    uint8_t buf[65536];
    while (true) {
      ssize_t n = ::recv(c.fd.get(), buf, sizeof buf, MSG_DONTWAIT);
      if (n > 0) {
        c.in.insert(c.in.end(), buf, buf + n);
        // A blocked client may not pile up unbounded input.
        if (c.in.size() > sp::kMaxFrameBytes + 8) return false;
        continue;
      }
      if (n == 0) return false;
      return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR;
    }
  }

  void acceptAll() {
    while (true) {
      int fd = ::accept4(listenFd.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) return;
      if (clients.size() >= kMaxClients) {
        ::close(fd);
        log(LogLevel::Warn, "store server: refusing a client beyond {} connections", kMaxClients);
        continue;
      }
      net::setNoDelay(fd);
      clients[nextClientId++].fd = Fd(fd);
    }
  }

  void run(const std::stop_token& stop) {
    std::vector<pollfd> fds;
    std::vector<uint64_t> ids;
    while (!stop.stop_requested()) {
      fds.assign({{wakeFd.get(), POLLIN, 0}, {listenFd.get(), POLLIN, 0}});
      ids.clear();
      for (auto& [id, c] : clients) {
        fds.push_back({c.fd.get(), static_cast<short>(POLLIN | (c.out.empty() ? 0 : POLLOUT)), 0});
        ids.push_back(id);
      }
      if (::poll(fds.data(), fds.size(), -1) < 0) {
        if (errno == EINTR) continue;
        log(LogLevel::Error, "store server: poll failed: {}", std::strerror(errno));
        return;
      }
      if (fds[0].revents != 0) return;
      if (fds[1].revents & POLLIN) acceptAll();
      bool mutated = false;
      for (size_t i = 0; i < ids.size(); ++i) {
        auto it = clients.find(ids[i]);
        Client& c = it->second;
        bool alive = true;
        if (fds[i + 2].revents & (POLLIN | POLLHUP | POLLERR)) alive = readFrom(c);
        if (alive) alive = process(c, mutated);
        if (alive) alive = flush(c);
        if (!alive) clients.erase(it);
      }
      // New keys may release clients blocked in Get/Wait.
      while (mutated) {
        mutated = false;
        for (auto it = clients.begin(); it != clients.end();) {
          Client& c = it->second;
          bool alive = !c.blocked || (process(c, mutated) && flush(c));
          it = alive ? std::next(it) : clients.erase(it);
        }
      }
    }
  }
};

TCPStoreServer::TCPStoreServer(const std::string& host, uint16_t port)
    : state_(std::make_unique<State>()) {
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

// Threading: one mutex serialises requests on the single connection.
struct TCPStore::State {
  std::string host;
  uint16_t port;
  TCPStoreOptions options;
  std::unique_ptr<TCPStoreServer> server;
  std::mutex mutex;
  Fd fd;

  std::string where() const { return fmt::format("{}:{}", host, port); }

  void connect(Clock::time_point deadline) {
    int errnum = 0;
    std::string detail;
    auto delay = std::chrono::milliseconds(10);
    while (true) {
      fd = net::tryConnectTcp(host, port, errnum, detail);
      if (fd) return;
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

  // Sends one request and waits for its response until the deadline; returns
  // false on timeout (the connection is then dropped: a late reply must not be
  // read as the answer to the next request).
  bool roundTrip(const sp::Request& req, sp::Response& resp, Clock::time_point deadline) {
    if (!fd) connect(Clock::now() + options.connectTimeout);
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
    std::lock_guard lock(mutex);
    sp::Response resp;
    if (roundTrip(req, resp, Clock::now() + timeout)) return resp;
    std::vector<std::string> missing;
    if (req.command == sp::Command::Get || req.command == sp::Command::Wait) {
      for (const auto& k : req.keys) {
        sp::Response r;
        if (roundTrip(sp::Request{.command = sp::Command::Check, .keys = {k}}, r,
                      Clock::now() + std::chrono::seconds(5)) &&
            !r.value.empty() && r.value[0] == 0) {
          missing.push_back(k);
        }
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
    state_->server = std::make_unique<TCPStoreServer>("0.0.0.0", port);
    state_->port = state_->server->port();
  }
  std::lock_guard lock(state_->mutex);
  state_->connect(Clock::now() + options.connectTimeout);
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
