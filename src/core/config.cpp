#include "rdmacc/config.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <charconv>
#include <cstdlib>

#include "rdmacc/error.hpp"
#include "rdmacc/log.hpp"
#include "rdmacc/options.hpp"

extern char** environ;

namespace rdmacc {
namespace {

using enum OptionType;

std::string lower(std::string_view text) {
  std::string out(text);
  std::transform(out.begin(), out.end(), out.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return out;
}

size_t editDistance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

// RDMACC_ALGO_<COLLECTIVE>: auto or one of that collective's algorithms.
void checkAlgorithm(std::string_view name, const std::string& text) {
  const std::string collective = lower(name.substr(std::string_view("RDMACC_ALGO_").size()));
  std::string names = "auto";
  for (Algorithm a : algorithmsOf(collective)) names += fmt::format(", {}", toString(a));
  const auto chosen = algorithmNamed(text);
  const auto allowed = algorithmsOf(collective);
  if (chosen == Algorithm::Auto ||
      (chosen && std::find(allowed.begin(), allowed.end(), *chosen) != allowed.end())) {
    return;
  }
  throw Error(ErrorKind::InvalidArgument,
              fmt::format("{}='{}' is not an algorithm of {}", name, text, collective),
              fmt::format("set {} to one of: {}", name, names));
}

// The options that take one of a few words: the first is the default.
void checkChoice(std::string_view name, const std::string& text) {
  static const std::vector<std::pair<std::string_view, std::vector<std::string_view>>> kChoices = {
      {"RDMACC_TRANSPORT", {"auto", "rdma", "shm"}},
      {"RDMACC_BOOTSTRAP", {"auto", "pmix", "env"}},
      {"RDMACC_SPIN_YIELD", {"auto", "0", "1"}},
      {"RDMACC_CONNECT", {"auto", "lazy", "eager"}},
  };
  for (const auto& [option, words] : kChoices) {
    if (option != name) continue;
    if (std::find(words.begin(), words.end(), text) != words.end()) return;
    const std::string list = fmt::format("{}", fmt::join(words, ", "));
    throw Error(ErrorKind::InvalidArgument,
                fmt::format("{}='{}' is not one of {}", name, text, list),
                fmt::format("set {} to one of {} ({} is the default)", name, list, words.front()));
  }
}

void validate(const OptionSpec& spec, const std::string& text) {
  switch (spec.type) {
    case Bool:
      parseBool(text, spec.name);
      break;
    case Duration:
      parseDuration(text, spec.name);
      break;
    case String:
      if (spec.name == "RDMACC_LOG_LEVEL") parseLogLevel(text);
      checkChoice(spec.name, text);
      if (spec.name == "RDMACC_SPIN_US" && text != "auto") {
        int64_t us = parseInt(text, spec.name);
        if (us < 0 || us > 10000000) {
          throw Error(ErrorKind::InvalidArgument,
                      fmt::format("RDMACC_SPIN_US={} is out of range", us),
                      "set RDMACC_SPIN_US to auto (the default) or 0 to 10000000 microseconds");
        }
      }
      if (spec.name.starts_with("RDMACC_ALGO_")) checkAlgorithm(spec.name, text);
      break;
    case Int: {
      int64_t v = parseInt(text, spec.name);
      if (v < spec.min || v > spec.max) {
        throw Error(ErrorKind::InvalidArgument,
                    fmt::format("{}={} is out of range", spec.name, text),
                    fmt::format("set {} to an integer in [{}, {}] ({})", spec.name, spec.min,
                                spec.max, spec.doc));
      }
      if (spec.name == "RDMACC_IB_MTU" && v != 0 && (v < 256 || (v & (v - 1)) != 0)) {
        throw Error(ErrorKind::InvalidArgument, fmt::format("RDMACC_IB_MTU={} is not an MTU", text),
                    "use 0 (automatic), 256, 512, 1024, 2048 or 4096");
      }
      break;
    }
  }
}

}  // namespace

const char* toString(OptionType type) noexcept {
  switch (type) {
    case Bool:
      return "bool";
    case Int:
      return "int";
    case String:
      return "string";
    case Duration:
      return "duration";
  }
  return "?";
}

const char* toString(ValueSource source) noexcept {
  switch (source) {
    case ValueSource::Default:
      return "default";
    case ValueSource::Environment:
      return "environment";
    case ValueSource::Explicit:
      return "explicit";
  }
  return "?";
}

const OptionSpec* findOption(std::string_view name) noexcept {
  for (const auto& spec : optionTable()) {
    if (spec.name == name) return &spec;
  }
  return nullptr;
}

bool parseBool(std::string_view text, std::string_view what) {
  std::string v = lower(text);
  if (v == "1" || v == "true" || v == "yes" || v == "on") return true;
  if (v == "0" || v == "false" || v == "no" || v == "off" || v.empty()) return false;
  throw Error(ErrorKind::InvalidArgument, fmt::format("{}='{}' is not a boolean", what, text),
              fmt::format("set {} to 1/0, true/false, yes/no or on/off", what));
}

int64_t parseInt(std::string_view text, std::string_view what) {
  int64_t value = 0;
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || ec != std::errc() || ptr != text.data() + text.size()) {
    throw Error(ErrorKind::InvalidArgument, fmt::format("{}='{}' is not an integer", what, text),
                fmt::format("set {} to a decimal integer", what));
  }
  return value;
}

size_t parseSize(std::string_view text, std::string_view what) {
  size_t mult = 1;
  std::string_view digits = text;
  if (!text.empty()) {
    switch (text.back()) {
      case 'K':
      case 'k':
        mult = size_t{1} << 10;
        break;
      case 'M':
      case 'm':
        mult = size_t{1} << 20;
        break;
      case 'G':
      case 'g':
        mult = size_t{1} << 30;
        break;
      default:
        break;
    }
    if (mult != 1) digits.remove_suffix(1);
  }
  if (digits.empty() || digits.find_first_not_of("-0123456789") != std::string_view::npos) {
    throw Error(ErrorKind::InvalidArgument, fmt::format("{}='{}' is not a size", what, text),
                "give a size in bytes with an optional K, M or G, e.g. 8, 64K, 16M");
  }
  int64_t v = parseInt(digits, what);
  if (v < 0) {
    throw Error(ErrorKind::InvalidArgument, fmt::format("{} {} is negative", what, text),
                "give a size in bytes, e.g. 8, 64K, 16M");
  }
  return static_cast<size_t>(v) * mult;
}

std::chrono::milliseconds parseDuration(std::string_view text, std::string_view what) {
  size_t digits = 0;
  while (digits < text.size() && std::isdigit(static_cast<unsigned char>(text[digits]))) ++digits;
  std::string_view unit = text.substr(digits);
  int64_t multiplier = -1;
  // A bare number has no unit, except 0: milliseconds here used to meet
  // seconds on the command line (RDMACC_TIMEOUT=1800 was 1.8 s).
  if (unit.empty() && digits > 0 && text.find_first_not_of('0') != std::string_view::npos) {
    throw Error(ErrorKind::InvalidArgument, fmt::format("{}='{}' has no unit", what, text),
                fmt::format("write {}={}s for seconds or {}={}ms for milliseconds", what, text,
                            what, text));
  }
  if (unit.empty() || unit == "ms")
    multiplier = 1;
  else if (unit == "s")
    multiplier = 1000;
  else if (unit == "m" || unit == "min")
    multiplier = 60 * 1000;
  else if (unit == "h")
    multiplier = 3600 * 1000;
  if (digits == 0 || multiplier < 0 || digits > 12) {
    throw Error(ErrorKind::InvalidArgument, fmt::format("{}='{}' is not a duration", what, text),
                fmt::format("write {} as a number with a unit: 500ms, 30s, 5m or 1h", what));
  }
  return std::chrono::milliseconds(parseInt(text.substr(0, digits), what) * multiplier);
}

Config Config::load(const std::map<std::string, std::string>& explicitValues) {
  std::vector<std::string> environment;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    if (std::string_view(*e).starts_with("RDMACC_")) environment.emplace_back(*e);
  }
  Config config = load(explicitValues, environment);
  for (const auto& warning : config.warnings()) log(LogLevel::Warn, "{}", warning);
  return config;
}

Config Config::load(const std::map<std::string, std::string>& explicitValues,
                    const std::vector<std::string>& environment) {
  Config config;
  for (const auto& spec : optionTable()) {
    config.values_[std::string(spec.name)] =
        Value{std::string(spec.defaultValue), ValueSource::Default};
  }
  for (const auto& entry : environment) {
    auto eq = entry.find('=');
    if (eq == std::string::npos || !entry.starts_with("RDMACC_")) continue;
    std::string name = entry.substr(0, eq);
    auto it = config.values_.find(name);
    if (it == config.values_.end()) {
      // Variables read by the test suite and the project's scripts rather
      // than the library (tools/run-tests, tools/with-rdma-device, ...).
      static constexpr std::string_view kProjectVariables[] = {
          "RDMACC_BUILD_DIR",     "RDMACC_FORCE_VM",      "RDMACC_VM_SHARES",
          "RDMACC_QUICK",         "RDMACC_TORCH2",        "RDMACC_FUZZ_SECONDS",
          "RDMACC_SANITIZE",      "RDMACC_TSAN",          "RDMACC_CCACHE",
          "RDMACC_PARSE_ONLY",    "RDMACC_CLUSTER",       "RDMACC_CLUSTER_FULL",
          "RDMACC_TORCH_VENV",    "RDMACC_TORCH_VERSION", "RDMACC_SYSTEM_TORCH_VENV",
          "RDMACC_TORCH2_PYTHON", "RDMACC_TORCH_PYTHON",  "RDMACC_TORCH_SUITE_PYTHON"};
      if (name.starts_with("RDMACC_TEST_") ||
          std::find(std::begin(kProjectVariables), std::end(kProjectVariables), name) !=
              std::end(kProjectVariables)) {
        continue;
      }
      std::string best;
      size_t bestDistance = 4;
      for (const auto& spec : optionTable()) {
        size_t d = editDistance(name, spec.name);
        if (d < bestDistance) bestDistance = d, best = spec.name;
      }
      // NCCL's spelling of the log level.
      if (name == "RDMACC_DEBUG") best = "RDMACC_LOG_LEVEL";
      config.warnings_.push_back(
          best.empty() ? fmt::format("unknown environment variable {} is ignored (rdmacc-info "
                                     "--config lists the known ones)",
                                     name)
                       : fmt::format("unknown environment variable {} is ignored; did you mean {}?",
                                     name, best));
      continue;
    }
    it->second = Value{entry.substr(eq + 1), ValueSource::Environment};
  }
  for (const auto& [name, text] : explicitValues) {
    auto it = config.values_.find(name);
    if (it == config.values_.end()) {
      throw Error(ErrorKind::InvalidArgument, fmt::format("unknown option '{}'", name),
                  "rdmacc-info --config lists the known options");
    }
    it->second = Value{text, ValueSource::Explicit};
  }
  for (const auto& spec : optionTable()) {
    const Value& v = config.values_.at(std::string(spec.name));
    try {
      validate(spec, v.text);
    } catch (const Error& e) {
      if (v.source == ValueSource::Explicit) {
        ErrorInfo info = e.info();
        info.message += " (set explicitly in the backend options)";
        throw Error(std::move(info));
      }
      throw;
    }
  }
  return config;
}

const Config::Value& Config::value(std::string_view name, OptionType expected) const {
  auto it = values_.find(name);
  const OptionSpec* spec = findOption(name);
  if (it == values_.end() || spec == nullptr || spec->type != expected) {
    throw Error(ErrorKind::Internal,
                fmt::format("config option {} read as {} but is not in the table as such", name,
                            toString(expected)));
  }
  return it->second;
}

const std::string& Config::raw(std::string_view name) const {
  auto it = values_.find(name);
  if (it == values_.end()) {
    throw Error(ErrorKind::Internal, fmt::format("no config option named {}", name));
  }
  return it->second.text;
}

std::string Config::shown(std::string_view name) const {
  const std::string& value = raw(name);
  const OptionSpec* spec = findOption(name);
  return spec != nullptr && spec->secret && !value.empty() ? "(set)" : value;
}

std::vector<std::string> Config::nonDefault() const {
  std::vector<std::string> out;
  for (const auto& spec : optionTable()) {
    if (source(spec.name) != ValueSource::Default) {
      out.push_back(fmt::format("{}={}", spec.name, shown(spec.name)));
    }
  }
  return out;
}

ValueSource Config::source(std::string_view name) const {
  auto it = values_.find(name);
  return it == values_.end() ? ValueSource::Default : it->second.source;
}

int64_t Config::getInt(std::string_view name) const {
  return parseInt(value(name, Int).text, name);
}
bool Config::getBool(std::string_view name) const {
  return parseBool(value(name, Bool).text, name);
}
const std::string& Config::getString(std::string_view name) const {
  return value(name, String).text;
}
std::chrono::milliseconds Config::getDuration(std::string_view name) const {
  return parseDuration(value(name, Duration).text, name);
}

}  // namespace rdmacc
