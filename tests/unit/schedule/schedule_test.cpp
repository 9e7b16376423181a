// The algorithms' index arithmetic, checked without a device: a simulator
// runs every rank's schedule with in-memory FIFOs per (sender, receiver) and
// the same step semantics as the engine (gated sends forward whole receives).
#include <gtest/gtest.h>

#include <bit>
#include <deque>
#include <map>
#include <numeric>
#include <set>

#include "src/schedule/algorithms/algorithms.hpp"
#include "src/schedule/schedule.hpp"

namespace rdmacc {
namespace {

using Bytes = std::vector<uint8_t>;

struct Rank {
  Schedule schedule;
  Bytes sendBuf, recvBuf;
  Bytes outBuf;  // receives toOutput: outBuf[i] is recvBuf's byte outOrigin + i
  size_t outOrigin = 0;
  bool sameBuffer = true;  // send and receive buffer are one (in-place algorithms)
  size_t step = 0;
  std::vector<bool> sent, received;
  Bytes& send() { return sameBuffer ? recvBuf : sendBuf; }
};

// Element-wise sum of uint8 (wrapping) stands for any reduction.
// With `mustFinish` false, stuck ranks and unread messages are the caller's
// to check (a barrier missing a rank).
void simulate(std::vector<Rank>& ranks, bool mustFinish = true) {
  const int n = static_cast<int>(ranks.size());
  // Each message carries its sender's step: the engine matches on it, so
  // the receiver must be at the same step.
  std::map<std::pair<int, int>, std::deque<std::pair<size_t, Bytes>>> wires;
  // Finalisation adds 0x40 to each byte it covers when its step starts, so
  // a test sees whether an element was finished once, twice or never.
  auto enter = [](Rank& r) {
    if (r.step >= r.schedule.size()) return;
    r.sent.assign(r.schedule[r.step].sends.size(), false);
    r.received.assign(r.schedule[r.step].recvs.size(), false);
    for (const Range& f : r.schedule[r.step].finalize) {
      for (size_t b = 0; b < f.bytes; ++b)
        r.recvBuf[f.offset + b] = static_cast<uint8_t>(r.recvBuf[f.offset + b] + 0x40);
    }
  };
  for (auto& r : ranks) {
    enter(r);
    for (const auto& s : r.schedule) {
      std::set<int> from;
      for (const auto& recv : s.recvs)
        ASSERT_TRUE(from.insert(recv.peer).second) << "two receives from one peer in a step";
    }
  }
  bool progress = true;
  while (progress) {
    progress = false;
    for (int me = 0; me < n; ++me) {
      Rank& r = ranks[static_cast<size_t>(me)];
      while (r.step < r.schedule.size()) {
        const Step& s = r.schedule[r.step];
        for (size_t j = 0; j < s.recvs.size(); ++j) {
          if (r.received[j]) continue;
          // as the engine: combine only once the send reading these bytes is out
          if (s.recvs[j].afterSend >= 0 && !r.sent[static_cast<size_t>(s.recvs[j].afterSend)])
            continue;
          auto& q = wires[{s.recvs[j].peer, me}];
          if (q.empty()) continue;
          auto [sentAt, msg] = q.front();
          q.pop_front();
          ASSERT_EQ(sentAt, r.step) << "rank " << me << " got a message of step " << sentAt
                                    << " from rank " << s.recvs[j].peer << " in step " << r.step;
          ASSERT_EQ(msg.size(), s.recvs[j].range.bytes) << "rank " << me << " step " << r.step;
          for (size_t b = 0; b < msg.size(); ++b) {
            const size_t at = s.recvs[j].range.offset + b;
            uint8_t& dst = s.recvs[j].toOutput ? r.outBuf.at(at - r.outOrigin) : r.recvBuf[at];
            switch (s.recvs[j].combine) {
              case Combine::Copy:
                dst = msg[b];
                break;
              case Combine::Reduce:
                dst = static_cast<uint8_t>(dst + msg[b]);
                break;
              case Combine::ReduceWithSend:
                dst = static_cast<uint8_t>(r.send()[at] + msg[b]);
                break;
            }
          }
          r.received[j] = true;
          progress = true;
        }
        for (size_t i = 0; i < s.sends.size(); ++i) {
          if (r.sent[i]) continue;
          bool ready = true;
          for (int g : s.sends[i].gates) ready = ready && r.received[static_cast<size_t>(g)];
          if (!ready) continue;
          const Range& range = s.sends[i].range;
          Bytes& src = s.sends[i].fromRecv ? r.recvBuf : r.send();
          wires[{me, s.sends[i].peer}].emplace_back(
              r.step, Bytes(src.begin() + static_cast<ptrdiff_t>(range.offset),
                            src.begin() + static_cast<ptrdiff_t>(range.offset + range.bytes)));
          r.sent[i] = true;
          progress = true;
        }
        bool done = std::all_of(r.sent.begin(), r.sent.end(), [](bool b) { return b; }) &&
                    std::all_of(r.received.begin(), r.received.end(), [](bool b) { return b; });
        if (!done) break;
        ++r.step;
        enter(r);
        progress = true;
      }
    }
  }
  if (!mustFinish) return;
  for (int me = 0; me < n; ++me) {
    EXPECT_EQ(ranks[static_cast<size_t>(me)].step, ranks[static_cast<size_t>(me)].schedule.size())
        << "rank " << me << " is stuck (deadlock)";
  }
  for (auto& [wire, q] : wires)
    EXPECT_TRUE(q.empty()) << "unconsumed message " << wire.first << "->" << wire.second;
}

uint8_t v(int rank, size_t i) {
  return static_cast<uint8_t>((rank * 7 + i * 3 + 1) % 16);
}

// Every rank's buffer holds the sum over ranks of v(rank, i).
void expectSummedEverywhere(const std::vector<Rank>& ranks, size_t count) {
  const int n = static_cast<int>(ranks.size());
  for (size_t i = 0; i < count; ++i) {
    uint8_t want = 0;
    for (int r = 0; r < n; ++r) want = static_cast<uint8_t>(want + v(r, i));
    for (int r = 0; r < n; ++r)
      ASSERT_EQ(ranks[static_cast<size_t>(r)].recvBuf[i], want)
          << "n=" << n << " count=" << count << " rank=" << r;
  }
}

class Sizes : public ::testing::TestWithParam<int> {};

TEST_P(Sizes, RingAllreduceSumsEverywhereAndEachBlockHasOneOwner) {
  const int n = GetParam();
  for (size_t count : {size_t{0}, size_t{1}, size_t{5}, size_t{17}, size_t{64}}) {
    std::vector<Rank> ranks(static_cast<size_t>(n));
    for (int r = 0; r < n; ++r) {
      auto& x = ranks[static_cast<size_t>(r)];
      x.schedule = algorithms::ringAllreduce(r, n, evenBlocks(count, n, 1), /*finalize=*/false);
      x.recvBuf.resize(count);
      for (size_t i = 0; i < count; ++i) x.recvBuf[i] = v(r, i);
    }
    simulate(ranks);
    expectSummedEverywhere(ranks, count);
    // Finalisation: every block exactly once, by its owner, before it travels.
    std::vector<int> finalised(count, 0);
    for (int r = 0; r < n; ++r) {
      for (const auto& s : algorithms::ringAllreduce(r, n, evenBlocks(count, n, 1), true)) {
        for (const Range& f : s.finalize) {
          for (size_t b = 0; b < f.bytes; ++b) ++finalised[f.offset + b];
        }
      }
    }
    for (size_t i = 0; i < count; ++i) EXPECT_EQ(finalised[i], 1) << "element " << i;
  }
}

TEST_P(Sizes, RingReduceScatterLeavesBlockRAtRankR) {
  const int n = GetParam();
  const size_t per = 3, count = per * static_cast<size_t>(n);
  std::vector<Rank> ranks(static_cast<size_t>(n));
  auto blocks = evenBlocks(count, n, 1);
  for (int r = 0; r < n; ++r) {
    auto& x = ranks[static_cast<size_t>(r)];
    x.schedule = algorithms::ringReduceScatter(r, n, blocks, false);
    x.recvBuf.resize(count);
    for (size_t i = 0; i < count; ++i) x.recvBuf[i] = v(r, i);
  }
  simulate(ranks);
  for (int r = 0; r < n; ++r) {
    for (size_t i = 0; i < per; ++i) {
      size_t at = static_cast<size_t>(r) * per + i;
      uint8_t want = 0;
      for (int q = 0; q < n; ++q) want = static_cast<uint8_t>(want + v(q, at));
      EXPECT_EQ(ranks[static_cast<size_t>(r)].recvBuf[at], want);
    }
  }
}

// Out of place: the input (send buffer) is read as it is and never written;
// the receive buffer starts as garbage, so reading an unwritten byte of it
// shows in the sums.
// The ring reduce-scatter that writes block r straight into rank r's output:
// reading the caller's input where it is (never written), or with send and
// receive buffer one (the inputs packed into scratch). Nothing but the
// output receives block r's result, and the output gets nothing else.
TEST_P(Sizes, RingReduceScatterToTheOutput) {
  const int n = GetParam();
  if (n == 1) GTEST_SKIP() << "no steps: the backend copies the block itself";
  for (bool fromInput : {true, false}) {
    for (size_t count :
         {size_t{0}, size_t{1}, static_cast<size_t>(n) * 3, static_cast<size_t>(n) * 3 + 2}) {
      std::vector<Rank> ranks(static_cast<size_t>(n));
      auto blocks = evenBlocks(count, n, 1);
      for (int r = 0; r < n; ++r) {
        auto& x = ranks[static_cast<size_t>(r)];
        const Range& mine = blocks[static_cast<size_t>(r)];
        x.schedule = algorithms::ringReduceScatterToOutput(r, n, blocks, fromInput);
        x.sameBuffer = !fromInput;
        Bytes& input = fromInput ? x.sendBuf : x.recvBuf;
        input.resize(count);
        for (size_t i = 0; i < count; ++i) input[i] = v(r, i);
        if (fromInput) x.recvBuf.assign(count, 0xee);
        x.outBuf.assign(mine.bytes, 0xee);
        x.outOrigin = mine.offset;
      }
      simulate(ranks);
      for (int r = 0; r < n; ++r) {
        const auto& x = ranks[static_cast<size_t>(r)];
        const Range& mine = blocks[static_cast<size_t>(r)];
        for (size_t b = 0; b < mine.bytes; ++b) {
          uint8_t want = 0;
          for (int q = 0; q < n; ++q) want = static_cast<uint8_t>(want + v(q, mine.offset + b));
          EXPECT_EQ(x.outBuf[b], want) << "n=" << n << " count=" << count << " rank=" << r;
          if (fromInput) {
            EXPECT_EQ(x.recvBuf[mine.offset + b], 0xee) << "block r went to scratch";
          }
        }
        if (fromInput) {
          for (size_t i = 0; i < count; ++i)
            ASSERT_EQ(x.sendBuf[i], v(r, i)) << "the input changed";
        }
      }
    }
  }
}

void checkAllgatherAndAlltoall(int n, bool linear) {
  std::vector<Rank> ranks(static_cast<size_t>(n));
  auto blocks = evenBlocks(static_cast<size_t>(n) * 2 + 1, n, 1);
  for (int r = 0; r < n; ++r) {
    auto& x = ranks[static_cast<size_t>(r)];
    x.schedule = linear ? algorithms::linearAllgather(r, n, blocks)
                        : algorithms::ringAllgather(r, n, blocks);
    if (linear) {
      EXPECT_LE(x.schedule.size(), 1u);
    }
    x.recvBuf.assign(static_cast<size_t>(n) * 2 + 1, 0);
    const Range& mine = blocks[static_cast<size_t>(r)];
    for (size_t b = 0; b < mine.bytes; ++b) x.recvBuf[mine.offset + b] = v(r, mine.offset + b);
  }
  simulate(ranks);
  for (int r = 0; r < n; ++r) {
    for (int q = 0; q < n; ++q) {
      const Range& blk = blocks[static_cast<size_t>(q)];
      for (size_t b = 0; b < blk.bytes; ++b)
        EXPECT_EQ(ranks[static_cast<size_t>(r)].recvBuf[blk.offset + b], v(q, blk.offset + b));
    }
  }
  // Alltoall with uneven blocks: rank r sends (r + p) % 3 bytes to p.
  std::vector<Rank> a(static_cast<size_t>(n));
  auto count = [](int from, int to) { return static_cast<size_t>((from + to) % 3); };
  for (int r = 0; r < n; ++r) {
    std::vector<size_t> in, out;
    for (int p = 0; p < n; ++p) in.push_back(count(r, p)), out.push_back(count(p, r));
    auto& x = a[static_cast<size_t>(r)];
    x.sameBuffer = false;
    x.schedule = linear ? algorithms::linearAlltoall(r, n, blocksOf(in, 1), blocksOf(out, 1))
                        : algorithms::pairwiseAlltoall(r, n, blocksOf(in, 1), blocksOf(out, 1));
    x.sendBuf.resize(std::accumulate(in.begin(), in.end(), size_t{0}));
    x.recvBuf.assign(std::accumulate(out.begin(), out.end(), size_t{0}), 0);
    size_t at = 0;
    for (int p = 0; p < n; ++p) {
      for (size_t j = 0; j < in[static_cast<size_t>(p)]; ++j)
        x.sendBuf[at++] = static_cast<uint8_t>(r * 16 + p);
    }
  }
  simulate(a);
  for (int r = 0; r < n; ++r) {
    size_t at = 0;
    for (int p = 0; p < n; ++p) {
      for (size_t j = 0; j < count(p, r); ++j, ++at) {
        if (p != r) {
          EXPECT_EQ(a[static_cast<size_t>(r)].recvBuf[at], static_cast<uint8_t>(p * 16 + r));
        }
      }
    }
  }
}

TEST_P(Sizes, LinearReduceScatterHandsRankRBlockRFromEveryone) {
  const int n = GetParam();
  const size_t count = 3 * static_cast<size_t>(n) + 1;  // uneven blocks
  std::vector<Rank> ranks(static_cast<size_t>(n));
  auto blocks = evenBlocks(count, n, 1);
  for (int r = 0; r < n; ++r) {
    auto& x = ranks[static_cast<size_t>(r)];
    x.sameBuffer = false;
    x.schedule = algorithms::linearReduceScatter(r, n, blocks);
    EXPECT_LE(x.schedule.size(), 1u);
    x.sendBuf.resize(count);
    for (size_t i = 0; i < count; ++i) x.sendBuf[i] = v(r, i);
    x.recvBuf.assign(static_cast<size_t>(n - 1) * blocks[static_cast<size_t>(r)].bytes, 0);
  }
  simulate(ranks);
  for (int r = 0; r < n; ++r) {
    const Range& mine = blocks[static_cast<size_t>(r)];
    for (int q = 0; q < n; ++q) {
      if (q == r) continue;
      size_t slot = static_cast<size_t>(q < r ? q : q - 1);
      for (size_t i = 0; i < mine.bytes; ++i) {
        EXPECT_EQ(ranks[static_cast<size_t>(r)].recvBuf[slot * mine.bytes + i],
                  v(q, mine.offset + i))
            << "rank " << r << " from " << q;
      }
    }
  }
}

TEST_P(Sizes, AllgatherAndAlltoallRingPairwiseAndLinear) {
  const int n = GetParam();
  for (bool linear : {false, true}) {
    SCOPED_TRACE(linear ? "linear" : "ring/pairwise");
    checkAllgatherAndAlltoall(n, linear);
  }
}

TEST_P(Sizes, TreesAndChainsFromEveryRoot) {
  const int n = GetParam();
  for (int root = 0; root < n; ++root) {
    for (auto build : {algorithms::treeBroadcast, algorithms::chainBroadcast}) {
      std::vector<Rank> ranks(static_cast<size_t>(n));
      for (int r = 0; r < n; ++r) {
        ranks[static_cast<size_t>(r)].schedule = build(r, n, root, 9);
        ranks[static_cast<size_t>(r)].recvBuf.assign(9, r == root ? 42 : 0);
      }
      simulate(ranks);
      for (int r = 0; r < n; ++r)
        EXPECT_EQ(ranks[static_cast<size_t>(r)].recvBuf, Bytes(9, 42)) << "root " << root;
    }
    std::vector<Rank> ranks(static_cast<size_t>(n));
    for (int r = 0; r < n; ++r) {
      ranks[static_cast<size_t>(r)].schedule = algorithms::treeReduce(r, n, root, 4);
      ranks[static_cast<size_t>(r)].recvBuf.assign(4, static_cast<uint8_t>(r + 1));
    }
    simulate(ranks);
    EXPECT_EQ(ranks[static_cast<size_t>(root)].recvBuf,
              Bytes(4, static_cast<uint8_t>(n * (n + 1) / 2)));
    // Binomial shape: every rank but the root has one parent that lists it as a child.
    for (int r = 0; r < n; ++r) {
      int parent = algorithms::binomialParent(r, n, root);
      if (r == root) {
        EXPECT_EQ(parent, -1);
        continue;
      }
      auto kids = algorithms::binomialChildren(parent, n, root);
      EXPECT_NE(std::find(kids.begin(), kids.end(), r), kids.end());
    }
  }
  std::vector<Rank> ranks(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) {
    ranks[static_cast<size_t>(r)].schedule = algorithms::treeAllreduce(r, n, 6, false);
    ranks[static_cast<size_t>(r)].recvBuf.assign(6, static_cast<uint8_t>(r + 1));
  }
  simulate(ranks);
  for (int r = 0; r < n; ++r)
    EXPECT_EQ(ranks[static_cast<size_t>(r)].recvBuf,
              Bytes(6, static_cast<uint8_t>(n * (n + 1) / 2)));
}

TEST_P(Sizes, LinearGatherScatterAndBarrier) {
  const int n = GetParam();
  for (int root : {0, n - 1}) {
    std::vector<Rank> g(static_cast<size_t>(n)), s(static_cast<size_t>(n));
    std::vector<Range> blocks;
    for (int r = 0; r < n; ++r) blocks.push_back(Range{static_cast<size_t>(r) * 2, 2});
    for (int r = 0; r < n; ++r) {
      auto& x = g[static_cast<size_t>(r)];
      x.sameBuffer = false;
      x.schedule = algorithms::linearGather(r, n, root, Range{0, 2}, blocks);
      x.sendBuf.assign(2, static_cast<uint8_t>(r + 10));
      x.recvBuf.assign(static_cast<size_t>(n) * 2, 0);
      auto& y = s[static_cast<size_t>(r)];
      y.sameBuffer = false;
      y.schedule = algorithms::linearScatter(r, n, root, blocks, Range{0, 2});
      y.sendBuf.resize(static_cast<size_t>(n) * 2);
      for (size_t i = 0; i < y.sendBuf.size(); ++i) y.sendBuf[i] = static_cast<uint8_t>(i / 2 + 20);
      y.recvBuf.assign(2, 0);
    }
    simulate(g);
    simulate(s);
    for (int r = 0; r < n; ++r) {
      if (r != root) {
        EXPECT_EQ(g[static_cast<size_t>(root)].recvBuf[static_cast<size_t>(r) * 2], r + 10);
        EXPECT_EQ(s[static_cast<size_t>(r)].recvBuf, Bytes(2, static_cast<uint8_t>(r + 20)));
      }
    }
  }
  std::vector<Rank> b(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r)
    b[static_cast<size_t>(r)].schedule = algorithms::disseminationBarrier(r, n);
  simulate(b);
  int rounds = 0;
  for (int d = 1; d < n; d <<= 1) ++rounds;
  EXPECT_EQ(static_cast<int>(algorithms::disseminationBarrier(0, n).size()), rounds);
}

TEST(RecursiveDoubling, SumsEverywhereInLog2Steps) {
  for (int n : {1, 2, 4, 8, 16}) {
    for (size_t count : {size_t{0}, size_t{1}, size_t{17}}) {
      std::vector<Rank> ranks(static_cast<size_t>(n));
      for (int r = 0; r < n; ++r) {
        auto& x = ranks[static_cast<size_t>(r)];
        x.schedule = algorithms::recursiveDoublingAllreduce(r, n, count, /*finalize=*/false);
        EXPECT_EQ(x.schedule.size(),
                  static_cast<size_t>(std::countr_zero(static_cast<unsigned>(n))));
        x.recvBuf.resize(count);
        for (size_t i = 0; i < count; ++i) x.recvBuf[i] = v(r, i);
      }
      simulate(ranks);
      expectSummedEverywhere(ranks, count);
    }
  }
  // finalize: every rank finishes the whole buffer, after the last exchange
  auto s = algorithms::recursiveDoublingAllreduce(1, 4, 8, /*finalize=*/true);
  ASSERT_EQ(s.size(), 3u);
  EXPECT_EQ(s.back().finalize, (std::vector<Range>{Range{0, 8}}));
  EXPECT_TRUE(algorithms::isPowerOfTwo(8));
  EXPECT_FALSE(algorithms::isPowerOfTwo(6));
}

// ------------------------------------------------------------ hierarchical --

// Host maps: contiguous, interleaved, uneven, one host, one rank per host.
const std::vector<std::vector<int>>& hostMaps() {
  static const std::vector<std::vector<int>> maps{{0, 0, 1, 1},
                                                  {0, 1, 0, 1},
                                                  {0, 0, 0, 1, 1},
                                                  {0, 1, 2, 0, 1, 2},
                                                  {0, 0, 0, 0},
                                                  {0, 1, 2},
                                                  {0},
                                                  {0, 1, 1, 1, 1, 0, 2},
                                                  {0, 0, 1, 1, 2, 2},
                                                  {0, 1, 2, 3, 0, 1, 2, 3}};
  return maps;
}

std::string describe(const std::vector<int>& map) {
  std::string out;
  for (int h : map) out += std::to_string(h);
  return "hosts " + out;
}

TEST(Hierarchical, HostsNumberRanksByHost) {
  algorithms::Hosts h({0, 1, 0, 2, 1});
  EXPECT_EQ(h.count(), 3);
  EXPECT_EQ(h.members[0], (std::vector<int>{0, 2}));
  EXPECT_EQ(h.localIndex(4), 1);
  EXPECT_EQ(h.largest(), 2u);
  EXPECT_FALSE(h.uniform());
  EXPECT_TRUE(h.layered());
  EXPECT_FALSE(algorithms::Hosts({0, 1, 2}).layered());
  EXPECT_FALSE(algorithms::Hosts::single(4).layered());
  EXPECT_FALSE(h.contiguous());
  EXPECT_TRUE(algorithms::Hosts({0, 0, 1, 1, 1}).contiguous());
  EXPECT_FALSE(algorithms::Hosts({0, 1, 0, 1}).contiguous());
  EXPECT_THROW(algorithms::Hosts({1, 0}), std::invalid_argument);
  EXPECT_THROW(algorithms::Hosts({0, 2, 1}), std::invalid_argument);
}

TEST(Hierarchical, AllreduceSumsEverywhereAndFinalisesEachElementOnce) {
  for (const auto& map : hostMaps()) {
    const algorithms::Hosts hosts(map);
    const int n = hosts.size();
    for (bool split : {false, true}) {
      for (bool finalize : {false, true}) {
        for (size_t count : {size_t{0}, size_t{1}, size_t{5}, size_t{17}, size_t{64}}) {
          std::vector<Rank> ranks(static_cast<size_t>(n));
          for (int r = 0; r < n; ++r) {
            auto& x = ranks[static_cast<size_t>(r)];
            x.schedule = algorithms::hierarchicalAllreduce(r, hosts, count, 1, finalize, split);
            x.recvBuf.resize(count);
            for (size_t i = 0; i < count; ++i) x.recvBuf[i] = v(r, i);
          }
          SCOPED_TRACE(describe(map) + (split ? " split" : " one leader") +
                       (finalize ? " finalize" : "") + " count " + std::to_string(count));
          simulate(ranks);
          for (size_t i = 0; i < count; ++i) {
            uint8_t want = finalize ? 0x40 : 0;
            for (int r = 0; r < n; ++r) want = static_cast<uint8_t>(want + v(r, i));
            for (int r = 0; r < n; ++r)
              ASSERT_EQ(ranks[static_cast<size_t>(r)].recvBuf[i], want)
                  << "rank " << r << " element " << i;
          }
        }
      }
    }
  }
}

// Across hosts the split form sends each byte over the network once per
// ring (every rank a share), the one-leader form only from leaders.
TEST(Hierarchical, OnlyLeadersCrossHostsWithOneLeader) {
  const algorithms::Hosts hosts({0, 0, 1, 1, 2, 2});
  for (int r = 0; r < hosts.size(); ++r) {
    int crossing = 0;
    for (const Step& s : algorithms::hierarchicalAllreduce(r, hosts, 60, 1, false, false)) {
      for (const auto& send : s.sends) crossing += hosts.host(send.peer) != hosts.host(r);
    }
    const bool leader = hosts.localIndex(r) == 0;
    EXPECT_EQ(crossing > 0, leader) << "rank " << r;
  }
  // Split: reduce-scatter (1 step), ring over 3 hosts (4 steps), allgather (1).
  EXPECT_EQ(algorithms::hierarchicalAllreduce(1, hosts, 60, 1, false, true).size(), 6u);
}

TEST(Hierarchical, BroadcastAndReduceFromEveryRoot) {
  for (const auto& map : hostMaps()) {
    const algorithms::Hosts hosts(map);
    const int n = hosts.size();
    for (int root = 0; root < n; ++root) {
      for (bool chain : {false, true}) {
        SCOPED_TRACE(describe(map) + " root " + std::to_string(root) + (chain ? " chain" : ""));
        const size_t count = 9;
        std::vector<Rank> b(static_cast<size_t>(n)), red(static_cast<size_t>(n));
        for (int r = 0; r < n; ++r) {
          auto& x = b[static_cast<size_t>(r)];
          x.schedule = algorithms::hierarchicalBroadcast(r, hosts, root, count, chain);
          EXPECT_LE(x.schedule.size(), 1u);
          x.recvBuf.assign(count, 0);
          if (r == root)
            for (size_t i = 0; i < count; ++i) x.recvBuf[i] = v(root, i);
          auto& y = red[static_cast<size_t>(r)];
          y.schedule = algorithms::hierarchicalReduce(r, hosts, root, count, chain);
          y.recvBuf.resize(count);
          for (size_t i = 0; i < count; ++i) y.recvBuf[i] = v(r, i);
          // At most one receive from, and one send to, another host per rank
          // and step ... and only leaders (the root leads its host) cross.
          for (const Step& s : y.schedule) {
            int crossing = 0;
            for (const auto& send : s.sends) crossing += hosts.host(send.peer) != hosts.host(r);
            EXPECT_LE(crossing, 1);
          }
        }
        simulate(b);
        simulate(red);
        uint8_t sum = 0;
        for (int r = 0; r < n; ++r) sum = static_cast<uint8_t>(sum + v(r, 0));
        EXPECT_EQ(red[static_cast<size_t>(root)].recvBuf[0], sum);
        for (int r = 0; r < n; ++r) {
          for (size_t i = 0; i < count; ++i)
            ASSERT_EQ(b[static_cast<size_t>(r)].recvBuf[i], v(root, i)) << "rank " << r;
          // A chain forwards one copy per rank and level: at most one child
          // across hosts and one inside.
          const auto& sched = b[static_cast<size_t>(r)].schedule;
          if (chain && !sched.empty()) {
            EXPECT_LE(sched[0].sends.size(), 2u) << "rank " << r;
          }
        }
      }
    }
  }
}

TEST(Hierarchical, BarrierCompletesAndOnlyLeadersCross) {
  for (const auto& map : hostMaps()) {
    const algorithms::Hosts hosts(map);
    std::vector<Rank> ranks(static_cast<size_t>(hosts.size()));
    for (int r = 0; r < hosts.size(); ++r) {
      ranks[static_cast<size_t>(r)].schedule = algorithms::hierarchicalBarrier(r, hosts);
      for (const Step& s : ranks[static_cast<size_t>(r)].schedule) {
        for (const auto& send : s.sends) {
          if (hosts.host(send.peer) != hosts.host(r)) {
            EXPECT_EQ(hosts.localIndex(r), 0) << describe(map) << " rank " << r;
          }
        }
      }
    }
    SCOPED_TRACE(describe(map));
    simulate(ranks);
    // Without any one rank, nobody else gets through.
    for (int absent = 0; absent < hosts.size() && hosts.size() > 1; ++absent) {
      std::vector<Rank> some(static_cast<size_t>(hosts.size()));
      for (int r = 0; r < hosts.size(); ++r) {
        if (r != absent)
          some[static_cast<size_t>(r)].schedule = algorithms::hierarchicalBarrier(r, hosts);
      }
      simulate(some, /*mustFinish=*/false);
      for (int r = 0; r < hosts.size(); ++r) {
        if (r == absent) continue;
        EXPECT_LT(some[static_cast<size_t>(r)].step, some[static_cast<size_t>(r)].schedule.size())
            << "rank " << r << " passed the barrier without rank " << absent;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, Sizes, ::testing::Values(1, 2, 3, 4, 5, 7, 8, 9, 16));

// A plan's extents (what the engine's admission of overlapping collectives
// reads) cover exactly the bytes its steps touch, each on its own side: the
// ring reduce-scatter that reads the caller's input touches the send buffer
// through its sends and ReduceWithSend receives, forwards partial sums from
// the receive buffer (fromRecv), and writes block r to the output.
TEST(Plan, ExtentsCoverWhatTheStepsTouchOnEachSide) {
  const int n = 4;
  const auto blocks = evenBlocks(1001, n, 4);
  for (int r = 0; r < n; ++r) {
    const Plan plan(algorithms::ringReduceScatterToOutput(r, n, blocks, /*fromInput=*/true));
    std::set<size_t> sendSide, recvSide, outSide;
    size_t largest = 0;
    auto mark = [](std::set<size_t>& side, const Range& range) {
      for (size_t i = 0; i < range.bytes; ++i) side.insert(range.offset + i);
    };
    for (const Step& s : plan.steps) {
      for (const SendSpec& send : s.sends) {
        mark(send.fromRecv ? recvSide : sendSide, send.range);
        largest = std::max(largest, send.range.bytes);
      }
      for (const RecvSpec& recv : s.recvs) {
        mark(recv.toOutput ? outSide : recvSide, recv.range);
        if (recv.combine == Combine::ReduceWithSend) mark(sendSide, recv.range);
      }
      for (const Range& f : s.finalize) mark(recvSide, f);
    }
    ASSERT_FALSE(sendSide.empty());
    ASSERT_FALSE(recvSide.empty());
    EXPECT_EQ(plan.sendExtent.offset, *sendSide.begin()) << "rank " << r;
    EXPECT_EQ(plan.sendExtent.offset + plan.sendExtent.bytes, *sendSide.rbegin() + 1);
    EXPECT_EQ(plan.recvExtent.offset, *recvSide.begin()) << "rank " << r;
    EXPECT_EQ(plan.recvExtent.offset + plan.recvExtent.bytes, *recvSide.rbegin() + 1);
    EXPECT_EQ(plan.largestSend, largest);
    ASSERT_FALSE(outSide.empty());
    EXPECT_EQ(plan.outExtent.offset, blocks[static_cast<size_t>(r)].offset);
    EXPECT_EQ(plan.outExtent.bytes, blocks[static_cast<size_t>(r)].bytes);
  }
  const Plan none(Schedule{});
  EXPECT_EQ(none.sendExtent.bytes, 0u);
  EXPECT_EQ(none.recvExtent.bytes, 0u);
  EXPECT_EQ(none.largestSend, 0u);
}

TEST(Blocks, EvenBlocksCoverEverythingOnce) {
  auto b = evenBlocks(10, 4, 4);
  ASSERT_EQ(b.size(), 4u);
  EXPECT_EQ(b[0], (Range{0, 12}));
  EXPECT_EQ(b[1], (Range{12, 12}));
  EXPECT_EQ(b[2], (Range{24, 8}));
  EXPECT_EQ(b[3], (Range{32, 8}));
  auto z = evenBlocks(2, 5, 8);
  EXPECT_EQ(z[4], (Range{16, 0}));
  EXPECT_EQ(blocksOf({3, 0, 2}, 2)[2], (Range{6, 4}));
}

}  // namespace
}  // namespace rdmacc
