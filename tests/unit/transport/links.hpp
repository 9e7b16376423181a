// The setups the Link tests share (link_test.cpp, link_board_test.cpp):
// every rank's link over one FakeNetwork, the world-and-pair groups, and
// what a channel's poll delivered (arrivals.hpp).
#pragma once

#include <cstdint>
#include <memory>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "rdmacc/error.hpp"
#include "src/engine/engine.hpp"
#include "src/transport/link.hpp"
#include "tests/unit/engine/fake_transport.hpp"
#include "tests/unit/transport/arrivals.hpp"

namespace rdmacc::testing {

// Every rank's link over one fake network (the founding group: all ranks).
struct Links {
  std::shared_ptr<FakeNetwork> net;
  std::vector<std::shared_ptr<Link>> of;
  Links(int size, int slots, size_t slotBytes, size_t unexpectedBytes = size_t{64} << 20) {
    net = std::make_shared<FakeNetwork>(size, slots, slotBytes);
    for (int r = 0; r < size; ++r) {
      of.push_back(std::make_shared<Link>(net->transport(r), r, size, unexpectedBytes));
    }
  }
  // Link rank `members[r]`'s engine for group rank r, on `channel`.
  std::unique_ptr<Engine> engine(uint32_t channel, const std::vector<int>& members, int r) {
    return std::make_unique<Engine>(
        of[static_cast<size_t>(members[static_cast<size_t>(r)])]->open(channel, r, members),
        EngineOptions{.group = fmt::format("channel{}", channel),
                      .rank = r,
                      .size = static_cast<int>(members.size())});
  }
};

// Two ranks, two slots of 256 bytes each way, and two groups over them:
// the world (channel 0) and a pair (channel 1), open at both ends.
struct WorldAndPair {
  Links links{2, /*slots=*/2, /*slotBytes=*/256};
  std::unique_ptr<Transport> world0 = links.of[0]->open(0, 0, {0, 1});
  std::unique_ptr<Transport> world1 = links.of[1]->open(0, 1, {0, 1});
  std::unique_ptr<Transport> pair0 = links.of[0]->open(1, 0, {0, 1});
  std::unique_ptr<Transport> pair1 = links.of[1]->open(1, 1, {0, 1});
};

// Rank r's input to an allreduce of `n` values in group `g`.
inline std::vector<int32_t> input(int g, int r, size_t n) {
  std::vector<int32_t> v(n);
  std::iota(v.begin(), v.end(), 100 * g + 10 * r);
  return v;
}

}  // namespace rdmacc::testing
