// Key-value stores through which the ranks of a group find each other
// (c10d's Store: set, get that waits, add, check, wait, deleteKey).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace rdmacc {

using Bytes = std::vector<uint8_t>;

Bytes toBytes(std::string_view text);
std::string toString(const Bytes& bytes);

// A collective exchange of records the launcher provides (PMIx's put, fence
// and get under mpirun or srun --mpi=pmix): every rank of `participants`
// (ranks of the group, ascending) calls it with the same key, in the same
// order, and gets the records of `wanted` (in that order) that those ranks
// passed as `mine`. A group formed with one exchanges its records through it
// instead of a set and a multiGet at the store.
using AllGather = std::function<std::vector<Bytes>(const std::string& key, const Bytes& mine,
                                                   const std::vector<int>& participants,
                                                   const std::vector<int>& wanted)>;

// Thread-safe: every method may be called from any thread.
class Store {
 public:
  static constexpr std::chrono::milliseconds kDefaultTimeout{300'000};

  explicit Store(std::chrono::milliseconds timeout = kDefaultTimeout) : timeout_(timeout) {}
  virtual ~Store() = default;
  Store(const Store&) = delete;
  Store& operator=(const Store&) = delete;

  virtual void set(const std::string& key, const Bytes& value) = 0;
  // Waits up to timeout() for the key; throws Error(Timeout) naming it.
  virtual Bytes get(const std::string& key) = 0;
  // Adds delta to the integer stored at key (0 if absent) and returns the sum.
  virtual int64_t add(const std::string& key, int64_t delta) = 0;
  // True when every key exists, without waiting.
  virtual bool check(const std::vector<std::string>& keys) = 0;
  // Waits until every key exists; throws Error(Timeout) naming the missing keys.
  virtual void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) = 0;
  void wait(const std::vector<std::string>& keys) { wait(keys, timeout()); }
  // True when the key existed.
  virtual bool deleteKey(const std::string& key) = 0;
  // The values of every key, in order, waiting (as get) until all exist: how
  // a rank reads every peer's record of a group in one request instead of
  // one per peer (TCPStore: one round trip). The default calls get per key.
  virtual std::vector<Bytes> multiGet(const std::vector<std::string>& keys,
                                      std::chrono::milliseconds timeout);
  std::vector<Bytes> multiGet(const std::vector<std::string>& keys) {
    return multiGet(keys, timeout());
  }

  std::chrono::milliseconds timeout() const noexcept { return timeout_.load(); }
  // Safe while other threads use the store: their calls use the old or the
  // new value.
  void setTimeout(std::chrono::milliseconds timeout) noexcept { timeout_.store(timeout); }

 private:
  std::atomic<std::chrono::milliseconds> timeout_;
};

// In-process store, for tests and single-process groups.
class HashStore final : public Store {
 public:
  explicit HashStore(std::chrono::milliseconds timeout = kDefaultTimeout);
  ~HashStore() override;
  void set(const std::string& key, const Bytes& value) override;
  Bytes get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t delta) override;
  bool check(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override;
  bool deleteKey(const std::string& key) override;
  using Store::wait;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

// A store in a file on a file system that every rank sees (NFS, Lustre, /tmp
// for one host). Records are appended under an flock(); readers replay them.
class FileStore final : public Store {
 public:
  explicit FileStore(std::string path, std::chrono::milliseconds timeout = kDefaultTimeout);
  ~FileStore() override;
  void set(const std::string& key, const Bytes& value) override;
  Bytes get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t delta) override;
  bool check(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override;
  bool deleteKey(const std::string& key) override;
  using Store::wait;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

// The TCP store server: a single thread serving any number of clients.
// Malformed frames close that client's connection and never the server.
// Thread-safe: construct, query port(), destroy (stops and joins the thread).
// What clients may make a TCPStoreServer hold: frames they have not finished
// sending, what it stores, the replies it has not sent yet, connections that
// never authenticate.
struct TCPStoreServerLimits {
  size_t inputBudget = size_t{1} << 30;  // bytes, all clients together
  std::chrono::milliseconds partialFrameIdle{60'000};
  // Keys and values stored, all clients together (RDMACC_STORE_MEMORY): a
  // set past it fails for that client. Replies not yet sent are held to the
  // same amount (one reply may exceed it when it is the only one).
  size_t memoryBudget = size_t{1} << 30;
  // With a key: a connection that has not proved it holds it by then is
  // closed, so idle connections cannot hold the descriptors ranks need.
  std::chrono::milliseconds authDeadline{10'000};
  // Connections served at once; 0: as many as the descriptor limit allows
  // (the soft limit is raised to the hard one first).
  size_t maxClients = 0;  // without more of the frame
};

class TCPStoreServer {
 public:
  using Limits = TCPStoreServerLimits;

  // port 0 picks a free port. Throws Error(Store) if it cannot listen. With
  // an authKey (RDMACC_AUTH_KEY), clients must prove they hold it
  // (challenge-response) before their first request, or are dropped.
  explicit TCPStoreServer(const std::string& host = "0.0.0.0", uint16_t port = 0,
                          std::string authKey = {}, Limits limits = {});
  ~TCPStoreServer();
  TCPStoreServer(const TCPStoreServer&) = delete;
  TCPStoreServer& operator=(const TCPStoreServer&) = delete;
  uint16_t port() const noexcept;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

struct TCPStoreOptions {
  bool isServer = false;  // host the server in this process (rank 0)
  std::chrono::milliseconds timeout = Store::kDefaultTimeout;
  // How long to keep retrying the first connection (the server may start later).
  std::chrono::milliseconds connectTimeout = std::chrono::seconds(60);
  // The job's shared secret (RDMACC_AUTH_KEY): the client authenticates with
  // it, and a server hosted here requires it. Empty: neither.
  std::string authKey;
  TCPStoreServerLimits serverLimits;  // a server hosted here
  // Connect at the first request rather than in the constructor (where a
  // wrong address or key would fail at once): for a store whose address
  // came from the launcher and that formation may not need at all.
  bool connectLazily = false;
};

// The client (and, with isServer, the server). Reconnects after a broken
// connection on the next call; fails with Error(Store) naming host:port.
class TCPStore final : public Store {
 public:
  TCPStore(std::string host, uint16_t port, TCPStoreOptions options = {});
  ~TCPStore() override;
  void set(const std::string& key, const Bytes& value) override;
  Bytes get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t delta) override;
  bool check(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override;
  bool deleteKey(const std::string& key) override;
  // One request: the server answers once every key exists.
  std::vector<Bytes> multiGet(const std::vector<std::string>& keys,
                              std::chrono::milliseconds timeout) override;
  using Store::multiGet;
  using Store::wait;
  uint16_t port() const noexcept;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

// Prepends prefix + "/" to every key: one store, many groups.
class PrefixStore final : public Store {
 public:
  PrefixStore(std::string prefix, std::shared_ptr<Store> store);
  void set(const std::string& key, const Bytes& value) override;
  Bytes get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t delta) override;
  bool check(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override;
  bool deleteKey(const std::string& key) override;
  std::vector<Bytes> multiGet(const std::vector<std::string>& keys,
                              std::chrono::milliseconds timeout) override;
  using Store::multiGet;
  using Store::wait;

 private:
  std::string key(const std::string& k) const { return prefix_ + "/" + k; }
  std::string prefix_;
  std::shared_ptr<Store> store_;
};

}  // namespace rdmacc
