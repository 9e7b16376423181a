// The TCP store client (TCPStore): a pool of connections, the client side of
// RDMACC_AUTH_KEY's challenge-response, timeouts that name the missing keys.
// The server is store/tcp_store_server.cpp.
#include <algorithm>
#include <mutex>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "rdmacc/error.hpp"
#include "rdmacc/log.hpp"
#include "rdmacc/store.hpp"
#include "src/core/deadline.hpp"
#include "src/store/auth.hpp"
#include "src/store/protocol.hpp"
#include "src/store/socket.hpp"
#include "src/store/store_util.hpp"

namespace rdmacc {
namespace sp = store_protocol;
using net::Clock;
using net::Fd;

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

  // A connection for one call: an idle one (`pooled`), or a new one.
  Fd take(bool& pooled) {
    {
      std::lock_guard lock(mutex);
      if (!idle.empty()) {
        Fd fd = std::move(idle.back());
        idle.pop_back();
        pooled = true;
        return fd;
      }
    }
    pooled = false;
    return connect(deadlineAfter(options.connectTimeout));
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

  // The client's side of the challenge-response (store/protocol.hpp): it
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
    bool pooled = false;
    Fd fd = take(pooled);
    sp::Response resp;
    const auto deadline = deadlineAfter(timeout);
    bool answered = false;
    try {
      answered = roundTrip(fd, req, resp, deadline);
    } catch (const Error& e) {
      // A connection that sat idle in the pool may have been closed by the
      // server (it closes never-used ones when descriptors run out): once
      // more on a new connection. Store errors only: the server's own
      // error replies are not retried.
      if (!pooled || e.kind() != ErrorKind::Store || resp.status == sp::Status::Error) throw;
      // Briefly: a server that is gone must still be reported at once.
      fd = connect(std::min(deadline, Clock::now() + std::chrono::seconds(2)));
      answered = roundTrip(fd, req, resp, deadline);
    }
    if (answered) {
      if (fd) giveBack(std::move(fd));
      return resp;
    }
    // Which keys are missing, for the error: one check per key, all within
    // one short budget, and none after the server stopped answering (a mute
    // server used to cost 5 s per key on top of the timeout).
    std::vector<std::string> missing;
    if (req.command == sp::Command::Get || req.command == sp::Command::Wait ||
        req.command == sp::Command::MultiGet) {
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
    state_->server =
        std::make_unique<TCPStoreServer>(bind, port, options.authKey, options.serverLimits);
    state_->port = state_->server->port();
  }
  // Connect now: a wrong address or key fails here, not at the first call.
  if (!options.connectLazily) {
    state_->giveBack(state_->connect(deadlineAfter(options.connectTimeout)));
  }
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

std::vector<Bytes> TCPStore::multiGet(const std::vector<std::string>& keys,
                                      std::chrono::milliseconds timeout) {
  if (keys.empty()) return {};
  auto r = state_->call({.command = sp::Command::MultiGet, .keys = keys}, timeout, "multiGet");
  auto values = sp::decodeValues(r.value, keys.size());
  if (!values) {
    throw Error(ErrorKind::Protocol,
                fmt::format("the store's multiGet reply for {} keys is malformed ({} bytes)",
                            keys.size(), r.value.size()));
  }
  return std::move(*values);
}

bool TCPStore::deleteKey(const std::string& key) {
  auto r = state_->call({.command = sp::Command::Delete, .keys = {key}}, timeout(), "deleteKey");
  return !r.value.empty() && r.value[0] != 0;
}

}  // namespace rdmacc
