// A later group over a shared link has a one-shot board of its own
// (src/transport/link.hpp, Link::ChannelBoard): its entries, its engines'
// allreduces, and the region's life after the group closes.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "rdmacc/error.hpp"
#include "src/engine/engine.hpp"
#include "src/transport/link.hpp"
#include "src/transport/wire.hpp"
#include "tests/unit/engine/fake_transport.hpp"
#include "tests/unit/engine/test_operations.hpp"
#include "tests/unit/transport/links.hpp"

namespace rdmacc {
namespace {

using namespace rdmacc::testing;  // FakeNetwork, the links and the operations

// A later group's channels with a board of their own: each member
// registers a region through its link (as offerLinks does) and learns the
// others' (as chooseLink does).
std::vector<std::unique_ptr<Transport>> openWithBoard(Links& links, uint32_t channel,
                                                      const std::vector<int>& members) {
  std::vector<RemoteWrites::Region> regions;
  std::vector<std::pair<uint64_t, uint32_t>> published;
  for (int b : members) {
    regions.push_back(
        *links.of[static_cast<size_t>(b)]->registerBoard(static_cast<int>(members.size())));
    published.emplace_back(regions.back().addr, regions.back().rkey);
  }
  std::vector<std::unique_ptr<Transport>> group;
  for (size_t r = 0; r < members.size(); ++r) {
    group.push_back(links.of[static_cast<size_t>(members[r])]->open(
        channel, static_cast<int>(r), members, 0, Link::ChannelBoard{regions[r], published}));
  }
  return group;
}

// A later group over a link has a one-shot board of its own: a
// contribution is one write per peer into the region that peer registered
// for the group (no message, no slot), entries alternate over operations,
// and a peer's entry of another operation fails naming that peer.
TEST(Link, ALaterGroupHasAOneShotBoardOfItsOwn) {
  Links links(3, /*slots=*/4, /*slotBytes=*/256);
  links.net->setBoardBytes(16);
  auto group = openWithBoard(links, 3, {2, 0, 1});  // group rank r is link rank {2, 0, 1}[r]
  std::vector<Board*> boards;
  for (auto& channel : group) {
    boards.push_back(channel->board());
    ASSERT_NE(boards.back(), nullptr);
    EXPECT_EQ(boards.back()->maxBytes(), 16u);
  }
  for (uint64_t sequence = 1; sequence <= 3; ++sequence) {
    for (int r = 0; r < 3; ++r) {
      ASSERT_TRUE(boards[r]->writable(sequence));
      const uint64_t value = 100 * sequence + static_cast<uint64_t>(r);
      boards[r]->post(sequence, 7, reinterpret_cast<const uint8_t*>(&value), sizeof value);
      EXPECT_FALSE(boards[r]->writable(sequence + 1)) << "one operation at a time";
    }
    for (int r = 0; r < 3; ++r) {
      for (int from = 0; from < 3; ++from) {
        if (from == r) continue;
        const uint8_t* got = boards[r]->peek(from, sequence, 7, sizeof(uint64_t));
        ASSERT_NE(got, nullptr) << "rank " << r << " from " << from << " #" << sequence;
        uint64_t value = 0;
        std::memcpy(&value, got, sizeof value);
        EXPECT_EQ(value, 100 * sequence + static_cast<uint64_t>(from));
      }
    }
    for (Board* b : boards) b->consumed(sequence);
  }
  for (int a = 0; a < 3; ++a) {
    for (int b = 0; b < 3; ++b) EXPECT_EQ(links.net->messages(a, b), 0) << a << " -> " << b;
  }
  const uint64_t value = 1;
  boards[0]->post(4, 7, reinterpret_cast<const uint8_t*>(&value), sizeof value);
  boards[1]->post(4, 8, reinterpret_cast<const uint8_t*>(&value), sizeof value);
  try {
    boards[0]->peek(1, 4, 7, sizeof value);
    ADD_FAILURE() << "took another operation's entry";
  } catch (const Error& e) {
    EXPECT_EQ(e.info().peerRank, 1) << e.what();
  }
}

// The engines of a later group run one-shot allreduces through its board
// over the link, each rank a thread, while the world's run through slots.
TEST(Link, ALaterGroupsEnginesReduceThroughItsBoard) {
  Links links(3, /*slots=*/4, /*slotBytes=*/256);
  links.net->setBoardBytes(64);
  const std::vector<int> members{1, 2, 0};
  auto channels = openWithBoard(links, 4, members);
  std::vector<std::unique_ptr<Engine>> engines;
  for (int r = 0; r < 3; ++r) {
    engines.push_back(
        std::make_unique<Engine>(std::move(channels[static_cast<size_t>(r)]),
                                 EngineOptions{.group = "later", .rank = r, .size = 3}));
    EXPECT_EQ(engines.back()->oneShotBytes(), 64u);
  }
  for (int round = 0; round < 5; ++round) {
    std::vector<std::vector<int32_t>> data;
    std::vector<std::shared_ptr<Work>> works;
    for (int r = 0; r < 3; ++r) data.push_back(input(round, r, 4));
    for (int r = 0; r < 3; ++r) works.push_back(engines[r]->submit(boardAllreduce(r, 3, data[r])));
    for (auto& w : works) ASSERT_TRUE(w->wait());
    for (int r = 0; r < 3; ++r) {
      for (size_t i = 0; i < 4; ++i) {
        EXPECT_EQ(data[r][i], 300 * round + 30 + 3 * static_cast<int32_t>(i)) << "rank " << r;
      }
    }
  }
  for (int a = 0; a < 3; ++a) {
    for (int b = 0; b < 3; ++b) EXPECT_EQ(links.net->messages(a, b), 0) << a << " -> " << b;
  }
}

// A group closed on one rank keeps its board's region registered until
// each peer left it: a peer still in a board operation writes there (freed
// at once, the write would break the peer's connection to this rank for
// every group on it).
TEST(Link, AClosedGroupsBoardStaysWritableUntilEveryPeerLeft) {
  WorldAndPair g;  // the world carries the leave messages' polls
  auto& [links, world0, world1, pair0, pair1] = g;
  links.net->setBoardBytes(16);
  auto group = openWithBoard(links, 4, {0, 1});
  EXPECT_EQ(links.net->liveRegions(0), 1u);
  group[0].reset();
  EXPECT_EQ(links.net->liveRegions(0), 1u) << "rank 1 has not left";
  const uint64_t value = 5;
  group[1]->board()->post(1, 7, reinterpret_cast<const uint8_t*>(&value), sizeof value);
  Arrivals got;
  group[1]->poll(got);
  EXPECT_TRUE(got.failures.empty()) << got.failures.front().second;
  group[1].reset();
  world0->poll(got);  // takes rank 1's leave message
  EXPECT_EQ(links.net->liveRegions(0), 0u);
  EXPECT_EQ(links.of[0]->closedChannels(), 0u) << "forgotten once rank 1 left";
}

// A group whose formation failed on one rank after it chose the link:
// that rank never opens the channel, but its peers did and write into the
// board region it offered. It abandons the channel: what the peers sent it
// is dropped, they learn at once that it left, and its region stays
// writable until they left too.
TEST(Link, AnAbandonedGroupsBoardStaysWritableUntilEveryPeerLeft) {
  WorldAndPair g;  // the world carries the leave messages' polls
  auto& [links, world0, world1, pair0, pair1] = g;
  links.net->setBoardBytes(16);
  const std::vector<int> members{0, 1};
  std::vector<RemoteWrites::Region> regions;
  std::vector<std::pair<uint64_t, uint32_t>> published;
  for (int b : members) {
    regions.push_back(*links.of[static_cast<size_t>(b)]->registerBoard(2));
    published.emplace_back(regions.back().addr, regions.back().rkey);
  }
  const uint32_t tag = Link::groupTag("failed here");
  auto opened = links.of[1]->open(4, 1, members, tag, Link::ChannelBoard{regions[1], published});
  const wire::Header h{.kind = wire::MessageKind::PointToPoint, .sequence = 1, .group = tag};
  ASSERT_TRUE(opened->trySend(0, h, nullptr));
  Arrivals got;
  world0->poll(got);  // an early message for channel 4 at rank 0
  EXPECT_EQ(links.of[0]->earlyCopies(), 1u);
  links.of[0]->abandon(4, members, tag, std::move(regions[0].keep));
  EXPECT_EQ(links.of[0]->earlyCopies(), 0u);
  EXPECT_EQ(links.of[0]->closedChannels(), 1u);
  EXPECT_EQ(links.net->liveRegions(0), 1u) << "rank 1 has not left";
  const uint64_t value = 5;
  opened->board()->post(1, 7, reinterpret_cast<const uint8_t*>(&value), sizeof value);
  opened->poll(got);
  EXPECT_TRUE(got.failures.empty()) << got.failures.front().second;
  EXPECT_EQ(opened->takeDisconnected(), std::vector<int>{0}) << "rank 0's leave message";
  opened.reset();
  world0->poll(got);  // takes rank 1's leave message
  EXPECT_EQ(links.net->liveRegions(0), 0u);
  EXPECT_EQ(links.of[0]->closedChannels(), 0u);
  EXPECT_TRUE(got.got.empty());
}

// A region offered to a group whose decision this rank never learnt stays
// registered while the link lives.
TEST(Link, ARetiredRegionLivesAsLongAsTheLink) {
  Links links(2, /*slots=*/4, /*slotBytes=*/256);
  links.net->setBoardBytes(16);
  auto region = links.of[0]->registerBoard(2);
  ASSERT_TRUE(region.has_value());
  links.of[0]->retire(std::move(region->keep));
  region.reset();
  EXPECT_EQ(links.net->liveRegions(0), 1u);
  links.of[0].reset();
  EXPECT_EQ(links.net->liveRegions(0), 0u);
}

// A link whose connections have no board gives later groups none.
TEST(Link, NoBoardOverConnectionsWithout) {
  Links links(2, /*slots=*/4, /*slotBytes=*/256);
  EXPECT_FALSE(links.of[0]->registerBoard(2).has_value());
  EXPECT_EQ(links.of[0]->open(2, 0, {0, 1})->board(), nullptr);
}

}  // namespace
}  // namespace rdmacc
