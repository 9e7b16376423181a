// HashStore, PrefixStore and helpers shared by every store.
#include <charconv>
#include <condition_variable>
#include <map>
#include <mutex>

#include <fmt/format.h>

#include "rdmacc/error.hpp"
#include "rdmacc/store.hpp"
#include "src/store/store_util.hpp"

namespace rdmacc {

Bytes toBytes(std::string_view text) {
  return Bytes(text.begin(), text.end());
}
std::string toString(const Bytes& bytes) {
  return std::string(bytes.begin(), bytes.end());
}

Error storeTimeout(const char* what, const std::vector<std::string>& missing,
                   std::chrono::milliseconds timeout, const std::string& where) {
  return Error(ErrorInfo{
      .kind = ErrorKind::Timeout,
      .message = fmt::format("store {} timed out after {} ms waiting for key(s) {} ({})", what,
                             timeout.count(), fmt::join(missing, ", "), where),
      .hint = "a rank that should have set these keys has not arrived; check that every rank "
              "started and uses the same store"});
}

std::vector<std::string> missingKeys(const std::map<std::string, Bytes>& data,
                                     const std::vector<std::string>& keys) {
  std::vector<std::string> out;
  for (const auto& k : keys) {
    if (!data.contains(k)) out.push_back(k);
  }
  return out;
}

namespace {

// The integer held by a counter key (c10d stores counters as decimal text).
int64_t counterValue(const Bytes& value, const std::string& key) {
  int64_t v = 0;
  std::string text = toString(value);
  size_t used = 0;
  try {
    v = std::stoll(text, &used);
  } catch (...) {
    used = 0;
  }
  if (text.empty() || used != text.size()) {
    throw Error(ErrorKind::Store,
                fmt::format("store add() on key '{}' whose value is not an integer", key));
  }
  return v;
}

}  // namespace

int64_t counterAdd(const Bytes* current, int64_t delta, const std::string& key) {
  const int64_t v = current == nullptr ? 0 : counterValue(*current, key);
  int64_t sum = 0;
  if (__builtin_add_overflow(v, delta, &sum)) {
    throw Error(ErrorKind::Store,
                fmt::format("store add({}) on key '{}' holding {} overflows a 64-bit counter",
                            delta, key, v));
  }
  return sum;
}

uint64_t storeNumber(const Bytes& value, uint64_t max, const std::string& key) {
  return storeNumber(toString(value), max, key);
}

std::vector<Bytes> exchangeRecords(Store& store, const AllGather& allGather,
                                   const std::string& prefix, int rank, const Bytes& mine,
                                   const std::vector<int>& participants,
                                   const std::vector<int>& wanted) {
  if (allGather) {
    std::vector<Bytes> records = allGather(prefix, mine, participants, wanted);
    if (records.size() != wanted.size()) {
      throw Error(ErrorKind::Internal,
                  fmt::format("the launcher's exchange of '{}' returned {} records for {} ranks",
                              prefix, records.size(), wanted.size()));
    }
    return records;
  }
  PrefixStore group(prefix, std::shared_ptr<Store>(&store, [](Store*) {}));
  group.set(fmt::format("{}", rank), mine);
  std::vector<std::string> keys;
  keys.reserve(wanted.size());
  for (int peer : wanted) keys.push_back(fmt::format("{}", peer));
  return group.multiGet(keys);
}

std::vector<std::string_view> splitFields(std::string_view text, char separator) {
  std::vector<std::string_view> fields;
  for (size_t at = 0;;) {
    const size_t end = text.find(separator, at);
    fields.push_back(text.substr(at, end - at));
    if (end == std::string_view::npos) return fields;
    at = end + 1;
  }
}

uint64_t storeNumber(std::string_view text, uint64_t max, const std::string& key) {
  uint64_t v = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (text.empty() || ec != std::errc() || end != text.data() + text.size() || v > max) {
    throw Error(ErrorKind::Protocol,
                fmt::format("the store's key '{}' holds '{}{}', not a number up to {}", key,
                            text.substr(0, 64), text.size() > 64 ? "..." : "", max),
                "every rank must run the same rdmacc version; is another job using this store?");
  }
  return v;
}

// Threading: one mutex guards the map; waiters sleep on the condition variable.
struct HashStore::State {
  std::mutex mutex;
  std::condition_variable changed;
  std::map<std::string, Bytes> data;
};

HashStore::HashStore(std::chrono::milliseconds timeout)
    : Store(timeout), state_(std::make_unique<State>()) {}
HashStore::~HashStore() = default;

void HashStore::set(const std::string& key, const Bytes& value) {
  {
    std::lock_guard lock(state_->mutex);
    state_->data[key] = value;
  }
  state_->changed.notify_all();
}

Bytes HashStore::get(const std::string& key) {
  wait({key});
  std::lock_guard lock(state_->mutex);
  return state_->data.at(key);
}

int64_t HashStore::add(const std::string& key, int64_t delta) {
  int64_t v = 0;
  {
    std::lock_guard lock(state_->mutex);
    auto it = state_->data.find(key);
    v = counterAdd(it == state_->data.end() ? nullptr : &it->second, delta, key);
    state_->data[key] = toBytes(std::to_string(v));
  }
  state_->changed.notify_all();
  return v;
}

bool HashStore::check(const std::vector<std::string>& keys) {
  std::lock_guard lock(state_->mutex);
  return missingKeys(state_->data, keys).empty();
}

void HashStore::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  std::unique_lock lock(state_->mutex);
  if (!state_->changed.wait_for(lock, timeout,
                                [&] { return missingKeys(state_->data, keys).empty(); })) {
    throw storeTimeout("wait", missingKeys(state_->data, keys), timeout, "in-process HashStore");
  }
}

bool HashStore::deleteKey(const std::string& key) {
  std::lock_guard lock(state_->mutex);
  return state_->data.erase(key) > 0;
}

PrefixStore::PrefixStore(std::string prefix, std::shared_ptr<Store> store)
    : Store(store->timeout()), prefix_(std::move(prefix)), store_(std::move(store)) {}

void PrefixStore::set(const std::string& k, const Bytes& value) {
  store_->set(key(k), value);
}
Bytes PrefixStore::get(const std::string& k) {
  // One request where the store has multiGet (TCPStore), under this store's timeout.
  return std::move(store_->multiGet({key(k)}, timeout()).front());
}
int64_t PrefixStore::add(const std::string& k, int64_t delta) {
  return store_->add(key(k), delta);
}
bool PrefixStore::check(const std::vector<std::string>& keys) {
  std::vector<std::string> full;
  for (const auto& k : keys) full.push_back(key(k));
  return store_->check(full);
}
void PrefixStore::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  std::vector<std::string> full;
  for (const auto& k : keys) full.push_back(key(k));
  store_->wait(full, timeout);
}
bool PrefixStore::deleteKey(const std::string& k) {
  return store_->deleteKey(key(k));
}
std::vector<Bytes> PrefixStore::multiGet(const std::vector<std::string>& keys,
                                         std::chrono::milliseconds timeout) {
  std::vector<std::string> full;
  full.reserve(keys.size());
  for (const auto& k : keys) full.push_back(key(k));
  return store_->multiGet(full, timeout);
}

std::vector<Bytes> Store::multiGet(const std::vector<std::string>& keys,
                                   std::chrono::milliseconds timeout) {
  if (!keys.empty()) wait(keys, timeout);
  std::vector<Bytes> values;
  values.reserve(keys.size());
  for (const auto& k : keys) values.push_back(get(k));
  return values;
}

}  // namespace rdmacc
