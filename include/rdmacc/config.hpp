// The configuration table: every rdmacc knob, its type, default, unit and doc.
// Precedence: explicit values (Backend options) > RDMACC_* environment > default.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace rdmacc {

enum class OptionType { Bool, Int, String, Duration };
const char* toString(OptionType type) noexcept;

struct OptionSpec {
  std::string_view name;  // RDMACC_*
  OptionType type;
  std::string_view defaultValue;  // as it would be written in the environment
  std::string_view unit;          // "" when unitless
  std::string_view doc;           // one line
  int64_t min = 0;                // Int only: inclusive range
  int64_t max = 0;
  bool secret = false;  // never shown: logs, --config and --json say "(set)"
};

// The table, in display order.
std::span<const OptionSpec> optionTable() noexcept;
const OptionSpec* findOption(std::string_view name) noexcept;

enum class ValueSource { Default, Environment, Explicit };
const char* toString(ValueSource source) noexcept;

// An immutable snapshot of every option, validated when loaded. Thread-safe (const).
class Config {
 public:
  // Reads the process environment. Throws Error(InvalidArgument) naming the
  // variable and the accepted form when a value does not parse or is out of range.
  static Config load(const std::map<std::string, std::string>& explicitValues = {});
  // Same, from an explicit environment (NAME=VALUE strings); for tests and tools.
  static Config load(const std::map<std::string, std::string>& explicitValues,
                     const std::vector<std::string>& environment);

  const std::string& raw(std::string_view name) const;  // the value as written
  // What a log line, a table or a JSON record may show: raw(), or "(set)"
  // for a secret that is set.
  std::string shown(std::string_view name) const;
  ValueSource source(std::string_view name) const;
  int64_t getInt(std::string_view name) const;
  bool getBool(std::string_view name) const;
  const std::string& getString(std::string_view name) const;
  std::chrono::milliseconds getDuration(std::string_view name) const;

  // NAME=value of every option not at its default (environment or explicit),
  // in the table's order: what a log line or a --json record shows.
  std::vector<std::string> nonDefault() const;

  // RDMACC_* environment variables that are not in the table, with a guess.
  const std::vector<std::string>& warnings() const noexcept { return warnings_; }

 private:
  struct Value {
    std::string text;
    ValueSource source = ValueSource::Default;
  };
  const Value& value(std::string_view name, OptionType expected) const;
  std::map<std::string, Value, std::less<>> values_;
  std::vector<std::string> warnings_;
};

// Parsers shared by the table and the tools; throw Error naming `what`.
bool parseBool(std::string_view text, std::string_view what);
int64_t parseInt(std::string_view text, std::string_view what);
// Bytes, with an optional K, M or G suffix (binary: 1K = 1024).
size_t parseSize(std::string_view text, std::string_view what);
// "250ms", "30s", "5m", "1h"; a bare number means milliseconds.
std::chrono::milliseconds parseDuration(std::string_view text, std::string_view what);

}  // namespace rdmacc
