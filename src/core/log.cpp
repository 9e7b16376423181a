#include "rdmacc/log.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <mutex>
#include <string>

#include "rdmacc/environment.hpp"
#include "rdmacc/error.hpp"

namespace rdmacc {
namespace {

LogLevel initialLevel() noexcept {
  const char* env = std::getenv("RDMACC_LOG_LEVEL");
  if (env == nullptr || *env == '\0') return LogLevel::Warn;
  try {
    return parseLogLevel(env);
  } catch (...) {
    return LogLevel::Warn;  // the config table reports the bad value
  }
}

std::atomic<LogLevel>& levelRef() noexcept {
  static std::atomic<LogLevel> level{initialLevel()};
  return level;
}

// The rank the launcher gave this process (torchrun, rdmacc-run, mpirun,
// srun), for %r in RDMACC_LOG_FILE: the log opens before any group exists.
// -1 when none says (or what it says is not a rank).
int launcherRank() noexcept {
  for (const char* name : {"RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID"}) {
    const char* text = std::getenv(name);
    if (text == nullptr || *text == '\0' || std::strlen(text) > 9) continue;
    if (std::strspn(text, "0123456789") != std::strlen(text)) continue;
    return std::atoi(text);
  }
  return -1;
}

// Where lines go without a user sink: the file RDMACC_LOG_FILE names (opened
// once, appended, close-on-exec, never through a symbolic link: another user
// could point one at a file of ours), else stderr. A file that cannot be
// opened is reported on stderr once, naming it and why, and lines stay on
// stderr.
int openLogFile() noexcept {
  const char* pattern = std::getenv("RDMACC_LOG_FILE");
  if (pattern == nullptr || *pattern == '\0') return STDERR_FILENO;
  try {
    const std::string path = expandPathPattern(pattern, launcherRank());
    int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | O_NOFOLLOW, 0640);
    if (fd >= 0) return fd;
    std::string line =
        fmt::format("rdmacc warn: RDMACC_LOG_FILE: cannot open '{}' ({}); logging to stderr\n",
                    path, std::strerror(errno));
    ssize_t ignored = ::write(STDERR_FILENO, line.data(), line.size());
    (void)ignored;
  } catch (...) {
  }
  return STDERR_FILENO;
}

// RDMACC_LOG_TIMESTAMPS: read once, as the level and the file are (before
// any Config exists); anything but 0/false/no/off keeps them.
bool timestampsFromEnvironment() {
  const char* text = std::getenv("RDMACC_LOG_TIMESTAMPS");
  if (text == nullptr) return true;
  const std::string_view v(text);
  return !(v == "0" || v == "false" || v == "no" || v == "off");
}

// "2026-12-03T13:30:01.123Z ": UTC, so that lines from several hosts sort.
std::string timestamp() {
  timespec now{};
  ::clock_gettime(CLOCK_REALTIME, &now);
  tm utc{};
  ::gmtime_r(&now.tv_sec, &utc);
  return fmt::format("{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:03}Z ", utc.tm_year + 1900,
                     utc.tm_mon + 1, utc.tm_mday, utc.tm_hour, utc.tm_min, utc.tm_sec,
                     now.tv_nsec / 1'000'000);
}

struct SinkState {
  std::mutex mutex;
  std::string prefix;
  std::function<void(LogLevel, std::string_view)> sink;
  int fd = openLogFile();
  bool timestamps = timestampsFromEnvironment();
};

SinkState& sinkState() {
  static SinkState state;
  return state;
}

}  // namespace

std::string expandPathPattern(std::string_view pattern, int rank) {
  std::string out;
  for (size_t i = 0; i < pattern.size(); ++i) {
    if (pattern[i] != '%' || i + 1 == pattern.size()) {
      out += pattern[i];
      continue;
    }
    const char c = pattern[++i];
    if (c == 'h') {
      out += hostName();
    } else if (c == 'p') {
      out += std::to_string(::getpid());
    } else if (c == 'r' && rank >= 0) {
      out += std::to_string(rank);
    } else if (c == '%') {
      out += '%';
    } else {
      out += '%';
      out += c;
    }
  }
  return out;
}

LogLevel parseLogLevel(std::string_view text) {
  std::string lower(text);
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  for (auto level : {LogLevel::Trace, LogLevel::Debug, LogLevel::Info, LogLevel::Warn,
                     LogLevel::Error, LogLevel::Off}) {
    if (lower == toString(level)) return level;
  }
  if (lower == "warning") return LogLevel::Warn;
  throw Error(ErrorKind::InvalidArgument, fmt::format("unknown log level '{}'", text),
              "use one of trace, debug, info, warn, error, off");
}

const char* toString(LogLevel level) noexcept {
  switch (level) {
    case LogLevel::Trace:
      return "trace";
    case LogLevel::Debug:
      return "debug";
    case LogLevel::Info:
      return "info";
    case LogLevel::Warn:
      return "warn";
    case LogLevel::Error:
      return "error";
    case LogLevel::Off:
      return "off";
  }
  return "?";
}

void setLogLevel(LogLevel level) noexcept {
  levelRef().store(level, std::memory_order_relaxed);
}
LogLevel logLevel() noexcept {
  return levelRef().load(std::memory_order_relaxed);
}

void setLogPrefix(std::string prefix) {
  auto& state = sinkState();
  std::lock_guard lock(state.mutex);
  state.prefix = std::move(prefix);
}

void setDefaultLogPrefix(std::string prefix) {
  auto& state = sinkState();
  std::lock_guard lock(state.mutex);
  if (state.prefix.empty()) state.prefix = std::move(prefix);
}

void setLogSink(std::function<void(LogLevel, std::string_view)> sink) {
  auto& state = sinkState();
  std::lock_guard lock(state.mutex);
  state.sink = std::move(sink);
}

void logMessage(LogLevel level, std::string_view message) noexcept {
  try {
    auto& state = sinkState();
    std::lock_guard lock(state.mutex);
    if (state.sink) {
      state.sink(level, message);
      return;
    }
    const std::string when = state.timestamps ? timestamp() : std::string();
    std::string line =
        state.prefix.empty()
            ? fmt::format("{}rdmacc {}: {}\n", when, toString(level), message)
            : fmt::format("{}rdmacc {} {}: {}\n", when, state.prefix, toString(level), message);
    // One write() per line so that lines of concurrent processes do not interleave.
    ssize_t ignored = ::write(state.fd, line.data(), line.size());
    (void)ignored;
  } catch (...) {
  }
}

}  // namespace rdmacc
