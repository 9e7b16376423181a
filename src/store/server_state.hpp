// The TCP store server's state, private to tcp_store_server.cpp (the
// connections: accept, authenticate, read, reply, expire, evict) and
// server_commands.cpp (the keys and values: run a command, block a Get or
// Wait until its keys exist, wake the waiters of a key).
#pragma once

#include <array>
#include <chrono>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "rdmacc/log.hpp"
#include "rdmacc/store.hpp"
#include "src/store/auth.hpp"
#include "src/store/protocol.hpp"
#include "src/store/socket.hpp"

namespace rdmacc {
namespace sp = store_protocol;

// At most one warning per this interval for misbehaving clients.
constexpr auto kStoreWarnInterval = std::chrono::seconds(10);

// Raises the soft descriptor limit to the hard one (the store may serve
// thousands of ranks; the default soft limit is often 1024), then returns
// how many clients to serve at most.
size_t storeClientLimit();

// Threading: all members but the eventfd belong to the server thread; the
// destructor writes the eventfd and joins.
struct TCPStoreServer::State {
  using Clock = net::Clock;
  using Fd = net::Fd;

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
  size_t maxClients = storeClientLimit();
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
    if (now - lastWarning < kStoreWarnInterval) {
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

  // Every reply goes out through here: outputHeld is the sum of backlogs.
  void queue(Client& c, const std::vector<uint8_t>& frame) {
    c.out.insert(c.out.end(), frame.begin(), frame.end());
    outputHeld += frame.size();
  }

  void awaitRoom(uint64_t id, Client& c) {
    if (!c.awaitsRoom) awaitingRoom.push_back(id);
    c.awaitsRoom = true;
  }

  // The commands (server_commands.cpp).
  // The bytes a Get or MultiGet reply holds (keys present), else 0.
  size_t replyBytes(const sp::Request& req) const;
  Outcome execute(const sp::Request& req, Client& c);
  void block(uint64_t id, Client& c, sp::Request req);
  void unblock(uint64_t id, Client& c);

  // After a mutation of `key`: the clients waiting for it look again.
  void mutated(const std::string& key, bool deleted);

  // The connections (tcp_store_server.cpp).
  // The challenge-response of a client that has not authenticated yet
  // (store/protocol.hpp); consumes its frames from c.in at offset. False:
  // drop it (told why, when it sent a request instead).
  bool authenticate(Client& c, size_t& offset);

  // Decodes and runs the client's queued frames; false if it must be dropped.
  bool process(uint64_t id, Client& c);
  bool flush(Client& c);
  bool readFrom(Client& c);
  void acceptAll();
  void drop(std::map<uint64_t, Client>::iterator it);

  // Makes room for a new connection when descriptors or client slots run
  // out: closes the oldest connection that has not proved itself (with a
  // key: not authenticated yet; without: never sent a byte, for
  // kQuietEvictAge), so idle sockets cannot lock the ranks out. False: none.
  bool evictOneUnproven();

  // One client's turn: read, run, reply. Whatever goes wrong with it (a
  // malformed frame, an allocation that fails) drops that client only.
  bool serve(uint64_t id, Client& c, short revents);

  // Drops clients that sat on an unfinished frame too long, and (with a
  // key) those that did not authenticate within the deadline.
  void expireIdle();
  void run(const std::stop_token& stop);
};

}  // namespace rdmacc
