// Tuning tables: which algorithm each collective uses at each size, measured
// on a machine by rdmacc-tune and loaded through RDMACC_TUNE_FILE.
//
// Text format, one rule per line ('#' starts a comment):
//   COLLECTIVE RANKS UP_TO_BYTES ALGORITHM
//   allreduce  4     65536       tree
//   allreduce  4     max         ring
// A call of `bytes` on a group of `ranks` takes the first rule of its
// collective, for the listed world size nearest to `ranks`, whose bound is
// >= bytes. Collectives: allreduce, broadcast; algorithms: ring, tree, and
// recursive_doubling for allreduce.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "rdmacc/options.hpp"

namespace rdmacc {

class TuningTable {
 public:
  struct Rule {
    std::string collective;
    int ranks = 0;
    size_t upTo = 0;  // SIZE_MAX for "max"
    Algorithm algorithm = Algorithm::Auto;
  };

  // Throws Error(InvalidArgument) naming the file, line and problem.
  static TuningTable parse(std::string_view text, const std::string& origin);
  static TuningTable load(const std::string& path);

  std::optional<Algorithm> lookup(std::string_view collective, int ranks, size_t bytes) const;
  std::string format(const std::string& comment) const;
  void add(Rule rule) { rules_.push_back(std::move(rule)); }
  bool empty() const noexcept { return rules_.empty(); }
  const std::vector<Rule>& rules() const noexcept { return rules_; }

 private:
  std::vector<Rule> rules_;
};

}  // namespace rdmacc
