// FileStore: an append-only log of records in one file, guarded by flock().
// Record: u32 key length, key, u32 value length (0xffffffff = deleted), value.
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>

#include <fmt/format.h>

#include "rdmacc/error.hpp"
#include "rdmacc/log.hpp"
#include "rdmacc/store.hpp"
#include "src/core/deadline.hpp"
#include "src/store/protocol.hpp"
#include "src/store/socket.hpp"
#include "src/store/store_util.hpp"

namespace rdmacc {
namespace {

constexpr uint32_t kTombstone = 0xffffffffu;
// Far above what a group's formation writes (records of bytes per rank),
// and the bound on what refresh() allocates: the file is ours and private,
// but one left over or grown (a sparse file of terabytes) must fail with an
// error that names it, not a bad_alloc or hours of replaying zeros.
constexpr off_t kMaxFileBytes = off_t{1} << 30;

// Holds an flock() for its lifetime.
class FileLock {
 public:
  FileLock(int fd, int op, const std::string& path) : fd_(fd) {
    while (::flock(fd_, op) != 0) {
      if (errno != EINTR)
        throw errnoError(ErrorKind::Store, "flock", errno, fmt::format("locking {}", path));
    }
  }
  ~FileLock() { ::flock(fd_, LOCK_UN); }
  FileLock(const FileLock&) = delete;
  FileLock& operator=(const FileLock&) = delete;

 private:
  int fd_;
};

}  // namespace

// Threading: the mutex serialises this process's threads; flock() other processes.
struct FileStore::State {
  std::string path;
  net::Fd fd;
  std::mutex mutex;
  std::map<std::string, Bytes> data;
  off_t offset = 0;  // how far the log has been replayed

  // Replays records appended since the last call. Caller holds an flock.
  void refresh() {
    struct stat st {};
    if (::fstat(fd.get(), &st) != 0) throw errnoError(ErrorKind::Store, "fstat", errno, path);
    if (st.st_size < offset) {  // the file was truncated or replaced: start over
      data.clear();
      offset = 0;
    }
    if (st.st_size == offset) return;
    if (st.st_size > kMaxFileBytes) {
      throw Error(ErrorKind::Store,
                  fmt::format("file store {} holds {} bytes, more than a store rdmacc writes ({})",
                              path, static_cast<long long>(st.st_size),
                              static_cast<long long>(kMaxFileBytes)),
                  "delete the file (no group may be using it), or give the job a new path");
    }
    std::vector<uint8_t> buf(static_cast<size_t>(st.st_size - offset));
    size_t got = 0;
    while (got < buf.size()) {
      ssize_t n =
          ::pread(fd.get(), buf.data() + got, buf.size() - got, offset + static_cast<off_t>(got));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0)
        throw errnoError(ErrorKind::Store, "pread", errno, fmt::format("reading {}", path));
      if (n == 0) break;
      got += static_cast<size_t>(n);
    }
    size_t pos = 0;
    auto corrupt = [&](const char* why) {
      return Error(ErrorKind::Store,
                   fmt::format("file store {} is corrupt at byte {}: {}", path,
                               offset + static_cast<off_t>(pos), why),
                   "delete the file (no group may be using it) and restart the job");
    };
    while (got - pos >= 4) {
      uint32_t klen = store_protocol::getU32(&buf[pos]);
      if (klen > store_protocol::kMaxKeyBytes) throw corrupt("key length out of range");
      if (got - pos < 8ull + klen) break;  // a record still being written
      uint32_t vlen = store_protocol::getU32(&buf[pos + 4 + klen]);
      size_t vbytes = vlen == kTombstone ? 0 : vlen;
      if (vlen != kTombstone && vlen > store_protocol::kMaxValueBytes)
        throw corrupt("value length out of range");
      if (got - pos < 8ull + klen + vbytes) break;
      std::string key(buf.begin() + static_cast<ptrdiff_t>(pos + 4),
                      buf.begin() + static_cast<ptrdiff_t>(pos + 4 + klen));
      if (vlen == kTombstone) {
        data.erase(key);
      } else {
        auto* v = &buf[pos + 8 + klen];
        data[key] = Bytes(v, v + vbytes);
      }
      pos += 8 + klen + vbytes;
    }
    offset += static_cast<off_t>(pos);
  }

  // Appends one record. Caller holds LOCK_EX. What the reader would refuse
  // (refresh(): key or value over the limits) is refused before anything is
  // written: one such record would make the file unreadable for every rank.
  // A write that fails half-way is cut off again, for the same reason.
  void append(const std::string& key, const Bytes* value) {
    if (key.size() > store_protocol::kMaxKeyBytes) {
      throw Error(ErrorKind::InvalidArgument,
                  fmt::format("store key of {} bytes is too long (at most {})", key.size(),
                              store_protocol::kMaxKeyBytes));
    }
    if (value != nullptr && value->size() > store_protocol::kMaxValueBytes) {
      throw Error(ErrorKind::InvalidArgument,
                  fmt::format("store value of {} bytes for key '{}' is too long (at most {})",
                              value->size(), key.substr(0, 64), store_protocol::kMaxValueBytes));
    }
    std::vector<uint8_t> rec;
    store_protocol::putU32(rec, static_cast<uint32_t>(key.size()));
    rec.insert(rec.end(), key.begin(), key.end());
    store_protocol::putU32(rec, value ? static_cast<uint32_t>(value->size()) : kTombstone);
    if (value) rec.insert(rec.end(), value->begin(), value->end());
    struct stat st {};
    if (::fstat(fd.get(), &st) != 0) throw errnoError(ErrorKind::Store, "fstat", errno, path);
    size_t done = 0;
    while (done < rec.size()) {
      ssize_t n = ::write(fd.get(), rec.data() + done, rec.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        const int error = errno;
        if (done > 0 && ::ftruncate(fd.get(), st.st_size) != 0) {
          log(LogLevel::Error, "file store {}: a half-written record could not be cut off: {}",
              path, std::strerror(errno));
        }
        throw errnoError(ErrorKind::Store, "write", error, fmt::format("appending to {}", path));
      }
      done += static_cast<size_t>(n);
    }
    refresh();
  }
};

FileStore::FileStore(std::string path, std::chrono::milliseconds timeout)
    : Store(timeout), state_(std::make_unique<State>()) {
  state_->path = std::move(path);
  // 0600: the group's rendezvous (addresses, tokens, rkeys) is for this
  // user's processes; O_NOFOLLOW: a symlink planted at the path is refused.
  state_->fd = net::Fd(
      ::open(state_->path.c_str(), O_RDWR | O_CREAT | O_APPEND | O_CLOEXEC | O_NOFOLLOW, 0600));
  if (!state_->fd) {
    throw errnoError(ErrorKind::Store, "open", errno,
                     fmt::format("cannot open file store {}", state_->path),
                     "the directory must exist and be writable on every rank");
  }
  // An existing file is used only when it is ours and nobody else may write
  // it: another user could have planted it (O_CREAT opens theirs too).
  struct stat st {};
  if (::fstat(state_->fd.get(), &st) != 0) {
    throw errnoError(ErrorKind::Store, "fstat", errno, state_->path);
  }
  if (st.st_uid != ::geteuid() || (st.st_mode & 022) != 0) {
    throw Error(ErrorKind::Store,
                fmt::format("file store {} belongs to uid {} with mode {:o}; this process (uid "
                            "{}) uses only a file of its own that group and others cannot write",
                            state_->path, st.st_uid, st.st_mode & 0777, ::geteuid()),
                "remove the file (or choose another path) and start the job again");
  }
}

FileStore::~FileStore() = default;

void FileStore::set(const std::string& key, const Bytes& value) {
  std::lock_guard lock(state_->mutex);
  FileLock flock(state_->fd.get(), LOCK_EX, state_->path);
  state_->append(key, &value);
}

Bytes FileStore::get(const std::string& key) {
  wait({key});
  std::lock_guard lock(state_->mutex);
  return state_->data.at(key);
}

int64_t FileStore::add(const std::string& key, int64_t delta) {
  std::lock_guard lock(state_->mutex);
  FileLock flock(state_->fd.get(), LOCK_EX, state_->path);
  state_->refresh();
  auto it = state_->data.find(key);
  int64_t v = counterAdd(it == state_->data.end() ? nullptr : &it->second, delta, key);
  Bytes text = toBytes(std::to_string(v));
  state_->append(key, &text);
  return v;
}

bool FileStore::check(const std::vector<std::string>& keys) {
  std::lock_guard lock(state_->mutex);
  FileLock flock(state_->fd.get(), LOCK_SH, state_->path);
  state_->refresh();
  return missingKeys(state_->data, keys).empty();
}

void FileStore::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  auto deadline = deadlineAfter(timeout);
  auto delay = std::chrono::milliseconds(1);
  while (true) {
    std::vector<std::string> missing;
    {
      std::lock_guard lock(state_->mutex);
      FileLock flock(state_->fd.get(), LOCK_SH, state_->path);
      state_->refresh();
      missing = missingKeys(state_->data, keys);
    }
    if (missing.empty()) return;
    if (net::Clock::now() >= deadline)
      throw storeTimeout("wait", missing, timeout, "file " + state_->path);
    std::this_thread::sleep_for(delay);
    delay = std::min(delay * 2, std::chrono::milliseconds(50));
  }
}

bool FileStore::deleteKey(const std::string& key) {
  std::lock_guard lock(state_->mutex);
  FileLock flock(state_->fd.get(), LOCK_EX, state_->path);
  state_->refresh();
  if (!state_->data.contains(key)) return false;
  state_->append(key, nullptr);
  return true;
}

}  // namespace rdmacc
