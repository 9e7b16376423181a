// Logging: one line per message on stderr (or a user sink), filtered by level.
#pragma once

#include <fmt/format.h>

#include <functional>
#include <string>
#include <string_view>

namespace rdmacc {

enum class LogLevel { Trace = 0, Debug, Info, Warn, Error, Off };

// Parses "trace|debug|info|warn|error|off" (case-insensitive); throws Error otherwise.
LogLevel parseLogLevel(std::string_view text);
const char* toString(LogLevel level) noexcept;

// Thread-safe. The level starts at RDMACC_LOG_LEVEL (default warn).
void setLogLevel(LogLevel level) noexcept;
LogLevel logLevel() noexcept;
inline bool logEnabled(LogLevel level) noexcept {
  return level >= logLevel();
}

// Prefix printed on every line, e.g. "rank 3". Thread-safe.
void setLogPrefix(std::string prefix);
// The same unless a prefix is set already: the first group a process forms
// (its world, under torch too) names the rank of every later line.
void setDefaultLogPrefix(std::string prefix);
// Replaces the stderr sink (nullptr restores it). The sink must be thread-safe.
void setLogSink(std::function<void(LogLevel, std::string_view)> sink);

void logMessage(LogLevel level, std::string_view message) noexcept;

// A file name pattern as RDMACC_LOG_FILE and RDMACC_TRACE_EVENTS take it:
// %h the host name, %p the process id, %r the rank (when rank >= 0), %% a %.
std::string expandPathPattern(std::string_view pattern, int rank = -1);

template <typename... Args>
void log(LogLevel level, fmt::format_string<Args...> format, Args&&... args) noexcept {
  if (!logEnabled(level)) return;
  try {
    logMessage(level, fmt::format(format, std::forward<Args>(args)...));
  } catch (...) {  // logging never throws (it runs in destructors and deleters)
  }
}

}  // namespace rdmacc
