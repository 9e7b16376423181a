#include "rdmacc/tuning.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <sstream>
#include <vector>

#include "rdmacc/error.hpp"

namespace rdmacc {
namespace {

constexpr size_t kMax = std::numeric_limits<size_t>::max();

// The collectives a table may tune (what rdmacc-tune measures); each may
// choose any of its algorithms (algorithmsOf).
constexpr std::string_view kTunable[] = {"allreduce", "broadcast", "allgather"};

bool tunable(std::string_view collective) {
  return std::find(std::begin(kTunable), std::end(kTunable), collective) != std::end(kTunable);
}

template <typename Items, typename Name>
std::string listOf(const Items& items, Name name) {
  std::string out;
  for (const auto& item : items) out += (out.empty() ? "" : ", ") + std::string(name(item));
  return out;
}

}  // namespace

TuningTable TuningTable::parse(std::string_view text, const std::string& origin) {
  TuningTable table;
  std::istringstream in{std::string(text)};
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    if (auto hash = line.find('#'); hash != std::string::npos) line.resize(hash);
    std::istringstream fields(line);
    std::string collective, ranks, upTo, algorithm, extra;
    if (!(fields >> collective)) continue;  // blank or comment
    auto bad = [&](const std::string& what) {
      return Error(ErrorKind::InvalidArgument, fmt::format("{}:{}: {}", origin, number, what),
                   "lines read COLLECTIVE RANKS UP_TO_BYTES ALGORITHM, e.g. 'allreduce 4 65536 "
                   "tree'; regenerate the file with rdmacc-tune");
    };
    if (!(fields >> ranks >> upTo >> algorithm) || (fields >> extra)) {
      throw bad(fmt::format("expected 4 fields in '{}'", line));
    }
    if (!tunable(collective)) {
      throw bad(fmt::format("unknown collective '{}' ({})", collective,
                            listOf(kTunable, [](std::string_view c) { return c; })));
    }
    Rule rule{.collective = collective};
    char* end = nullptr;
    long r = std::strtol(ranks.c_str(), &end, 10);
    if (*end != '\0' || r < 1 || r > (1 << 20))
      throw bad(fmt::format("bad rank count '{}'", ranks));
    rule.ranks = static_cast<int>(r);
    if (upTo == "max") {
      rule.upTo = kMax;
    } else {
      unsigned long long v = std::strtoull(upTo.c_str(), &end, 10);
      if (*end != '\0' || upTo.empty() || upTo[0] == '-') {
        throw bad(fmt::format("bad byte bound '{}' (a number or max)", upTo));
      }
      rule.upTo = static_cast<size_t>(v);
    }
    auto names = [](Algorithm a) { return toString(a); };
    const auto allowed = algorithmsOf(collective);
    auto it = std::find_if(allowed.begin(), allowed.end(),
                           [&](Algorithm a) { return algorithm == toString(a); });
    if (it == allowed.end()) {
      throw bad(fmt::format("unknown algorithm '{}' for {} ({})", algorithm, collective,
                            listOf(allowed, names)));
    }
    rule.algorithm = *it;
    table.rules_.push_back(std::move(rule));
  }
  return table;
}

TuningTable TuningTable::load(const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    throw Error(ErrorKind::InvalidArgument, fmt::format("cannot read tuning file {}", path),
                "RDMACC_TUNE_FILE must name a file written by rdmacc-tune (or unset it)");
  }
  std::stringstream text;
  text << in.rdbuf();
  return parse(text.str(), path);
}

std::optional<Algorithm> TuningTable::lookup(std::string_view collective, int ranks,
                                             size_t bytes) const {
  int best = -1;  // the listed world size nearest to ranks (the smaller on a tie)
  for (const Rule& r : rules_) {
    if (r.collective != collective) continue;
    if (best < 0 || std::abs(r.ranks - ranks) < std::abs(best - ranks) ||
        (std::abs(r.ranks - ranks) == std::abs(best - ranks) && r.ranks < best)) {
      best = r.ranks;
    }
  }
  if (best < 0) return std::nullopt;
  for (const Rule& r : rules_) {
    if (r.collective == collective && r.ranks == best && bytes <= r.upTo) return r.algorithm;
  }
  return std::nullopt;
}

std::string TuningTable::format(const std::string& comment) const {
  std::string out = "# rdmacc tuning table (RDMACC_TUNE_FILE)\n";
  std::istringstream lines(comment);
  for (std::string line; std::getline(lines, line);) out += "# " + line + "\n";
  out += "# collective ranks up_to_bytes algorithm\n";
  for (const Rule& r : rules_) {
    out += fmt::format("{} {} {} {}\n", r.collective, r.ranks,
                       r.upTo == kMax ? std::string("max") : std::to_string(r.upTo),
                       toString(r.algorithm));
  }
  return out;
}

}  // namespace rdmacc
