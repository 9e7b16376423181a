// Command lines of the rdmacc tools, on CLI11: one way to spell sizes and
// durations, one --version, generated --help, and one meaning of the exit
// status: 0 done, 1 the run or a check failed, 2 the command line is wrong.
#pragma once

#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>

#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include "rdmacc/config.hpp"
#include "rdmacc/version.hpp"

namespace rdmacc::cli {

constexpr int kFailed = 1;
constexpr int kUsage = 2;

// --version prints "<tool> <version>".
inline void addVersion(CLI::App& app) {
  app.set_version_flag("--version", fmt::format("{} {}", app.get_name(), rdmacc::version()));
}

// Parses argv. nullopt: go on; else the exit status (--help and --version: 0,
// a usage error, printed with a pointer to --help: 2). With RDMACC_PARSE_ONLY=1
// a command line that parses exits 0 at once: the documentation test
// (tests/docs/commands.py) checks every command the docs show this way.
inline std::optional<int> parse(CLI::App& app, int argc, char** argv) {
  try {
    app.parse(argc, argv);
    if (const char* only = std::getenv("RDMACC_PARSE_ONLY");
        only && std::string_view(only) == "1") {
      return 0;
    }
    return std::nullopt;
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    app.exit(e);
    return kUsage;
  }
}

// A CLI11 validator from one of rdmacc's parsers: what it throws becomes the
// usage error.
template <typename Parser>
CLI::Validator checkedBy(const std::string& name, Parser parser) {
  return CLI::Validator(
      [parser](std::string& text) -> std::string {
        try {
          parser(text);
          return {};
        } catch (const std::exception& e) {
          return e.what();
        }
      },
      name);
}

// Bytes with an optional K, M or G suffix (1K = 1024), as RDMACC_* sizes.
inline CLI::Validator size() {
  return checkedBy("SIZE", [](const std::string& s) { parseSize(s, "size"); });
}

// A duration: "250ms", "30s", "5m", "1h"; a bare number is seconds, as for
// timeout(1).
inline std::chrono::milliseconds parseSeconds(const std::string& text) {
  if (!text.empty() && text.find_first_not_of("0123456789") == std::string::npos) {
    return std::chrono::seconds(parseInt(text, "duration"));
  }
  return parseDuration(text, "duration");
}
inline CLI::Validator duration() {
  return checkedBy("DURATION", [](const std::string& s) { parseSeconds(s); });
}

}  // namespace rdmacc::cli
