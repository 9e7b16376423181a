// InProcess.* device tests of connections groups share (docs/decisions/019,
// RDMACC_SHARE_CONNECTIONS=1): what docs/security.md promises there, checked
// on a real verbs device.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <optional>
#include <vector>

#include "rdmacc/error.hpp"
#include "rdmacc/store.hpp"
#include "src/core/buffer.hpp"
#include "src/engine/engine.hpp"
#include "src/transport/link.hpp"
#include "src/transport/rdma/transport.hpp"
#include "src/transport/registration_cache.hpp"
#include "src/transport/wire.hpp"
#include "tests/device/in_process.hpp"
#include "tests/unit/engine/test_operations.hpp"
#include "tests/unit/transport/arrivals.hpp"

namespace rdmacc {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

// docs/security.md, "Memory the user registered", over shared connections:
// a later group registers in the founding group's protection domain, so the
// rkey of its advert opens the registration to every rank of the founding
// group, not only to the later group's. Ranks 0, 1 and 2 found a link; the
// group {0, 1} runs over channel 1 and rank 0 advertises a direct receive in
// registered memory to rank 1; rank 2, outside that group, writes with the
// advert's rkey through its own queue pair to rank 0: the bytes land, until
// rank 0 deregisters the memory.
TEST(InProcess, OverASharedLinkAnAdvertsRkeyOpensTheRegistrationToTheFoundingGroup) {
  HashStore store(20s);
  constexpr int kFounders = 3;
  constexpr int kLater = 2;
  constexpr size_t kBytes = 64 << 10;
  auto [meshes, transports, errors] = formInProcess(store, "founding", kFounders, quickConfig(),
                                                    TransportOptions{.slotsPerPeer = 4});
  for (const auto& e : errors) ASSERT_EQ(e, "");
  std::vector<std::shared_ptr<Link>> links;
  for (int r = 0; r < kFounders; ++r) {
    links.push_back(std::make_shared<Link>(std::move(transports[static_cast<size_t>(r)]), r,
                                           kFounders, 1 << 20));
  }
  constexpr uint32_t kChannel = 1;
  // Rank 0 of the later group: its registrations, made as the backend makes
  // them over a link (in the link's protection domain), and an engine.
  RegistrationCache registered(userMemoryRegistrar(meshes[0]->pd()), true, /*pageBytes=*/1);
  PageBuffer target(kBytes);
  std::fill_n(target.data(), kBytes, uint8_t{0x11});
  registered.add(target.data(), kBytes);
  auto engine = std::make_unique<Engine>(links[0]->open(kChannel, 0, {0, 1}),
                                         EngineOptions{.group = "later",
                                                       .rank = 0,
                                                       .size = kLater,
                                                       .registrations = &registered,
                                                       .zeroCopyMinBytes = 4096});
  auto work = advertisingAllgather(*engine, target.data(), kBytes, kLater);
  // Rank 1 of the later group takes the advert off its channel.
  auto channel1 = links[1]->open(kChannel, 1, {0, 1});
  const std::optional<wire::Header> advert = takeAdvert(*channel1);
  ASSERT_TRUE(advert) << "rank 0 advertised no direct receive over the shared link";
  ASSERT_EQ(advert->addr, reinterpret_cast<uintptr_t>(target.data()) + kBytes / 2);  // rank 1's
  EXPECT_THROW(work->wait(), Error);  // over: timed out
  // Rank 2, outside the later group, through its queue pair to rank 0.
  expectRkeyOpensUntilDeregistered(*meshes[2], meshes[2]->qp(0), registered, target.data(),
                                   advert->rkey);
  engine.reset();
  channel1.reset();
  links.clear();
}

// A later group over a link has a one-shot board of its own on a real
// device (decision 019's follow-up): ranks 0-2 found a link, the group of
// link ranks {2, 0} forms over it with a region each registered for it,
// and its 8-byte allreduces run as one RDMA WRITE per peer into those
// regions, entries alternating, each rank getting the sum.
TEST(InProcess, OverASharedLinkALaterGroupReducesThroughItsOwnBoard) {
  HashStore store(20s);
  constexpr int kFounders = 3;
  auto [meshes, transports, errors] =
      formInProcess(store, "founding-board", kFounders, quickConfig(), TransportOptions{});
  for (const auto& e : errors) ASSERT_EQ(e, "");
  std::vector<std::shared_ptr<Link>> links;
  for (int r = 0; r < kFounders; ++r) {
    links.push_back(std::make_shared<Link>(std::move(transports[static_cast<size_t>(r)]), r,
                                           kFounders, 1 << 20));
  }
  const std::vector<int> members{2, 0};
  std::vector<RemoteWrites::Region> regions;
  std::vector<std::pair<uint64_t, uint32_t>> published;
  for (int b : members) {
    auto region = links[static_cast<size_t>(b)]->registerBoard(2);
    ASSERT_TRUE(region) << "the founding group's connections have no board";
    regions.push_back(*region);
    published.emplace_back(region->addr, region->rkey);
  }
  std::vector<std::unique_ptr<Engine>> engines;
  for (int r = 0; r < 2; ++r) {
    engines.push_back(std::make_unique<Engine>(
        links[static_cast<size_t>(members[static_cast<size_t>(r)])]->open(
            2, r, members, 0, Link::ChannelBoard{regions[static_cast<size_t>(r)], published}),
        EngineOptions{.group = "later-board", .rank = r, .size = 2}));
    ASSERT_GT(engines.back()->oneShotBytes(), 0u);
  }
  for (int32_t round = 0; round < 5; ++round) {
    std::vector<std::vector<int32_t>> data{{round, 1}, {10 * round, 2}};
    auto a = engines[0]->submit(testing::boardAllreduce(0, 2, data[0]));
    auto b = engines[1]->submit(testing::boardAllreduce(1, 2, data[1]));
    ASSERT_TRUE(a->wait());
    ASSERT_TRUE(b->wait());
    for (const auto& d : data) EXPECT_EQ(d, (std::vector<int32_t>{11 * round, 3}));
  }
  engines.clear();
  links.clear();
}

// A later group whose formation failed on one rank after the group chose
// the link (decision 019): that rank abandons the channel (Link::abandon)
// and keeps its board region, so its formed peer's board write lands over
// the real device and the link's connection stays up for every group. A
// region freed at once would fail that write with a remote access error,
// which takes the queue pair, and the world's message behind it, down.
TEST(InProcess, OverASharedLinkAnAbandonedGroupsBoardStaysWritable) {
  HashStore store(20s);
  auto [meshes, transports, errors] =
      formInProcess(store, "founding-abandon", 2, quickConfig(), TransportOptions{});
  for (const auto& e : errors) ASSERT_EQ(e, "");
  std::vector<std::shared_ptr<Link>> links;
  for (int r = 0; r < 2; ++r) {
    links.push_back(
        std::make_shared<Link>(std::move(transports[static_cast<size_t>(r)]), r, 2, 1 << 20));
  }
  const std::vector<int> members{0, 1};
  auto world0 = links[0]->open(0, 0, members);
  auto world1 = links[1]->open(0, 1, members);
  std::vector<RemoteWrites::Region> regions;
  std::vector<std::pair<uint64_t, uint32_t>> published;
  for (auto& link : links) {
    auto region = link->registerBoard(2);
    ASSERT_TRUE(region) << "the founding group's connections have no board";
    regions.push_back(*region);
    published.emplace_back(region->addr, region->rkey);
  }
  const uint32_t tag = Link::groupTag("abandoned");
  auto formed = links[1]->open(2, 1, members, tag, Link::ChannelBoard{regions[1], published});
  links[0]->abandon(2, members, tag, std::move(regions[0].keep));
  const uint64_t value = 7;
  formed->board()->post(1, 9, reinterpret_cast<const uint8_t*>(&value), sizeof value);
  // The world's message goes after the board write on the same queue pair
  // (RC keeps the order): once it arrives, the write was taken.
  const wire::Header h{.kind = wire::MessageKind::PointToPoint, .sequence = 1};
  ASSERT_TRUE(world1->trySend(0, h, nullptr));
  testing::Arrivals got0, got1;
  const auto deadline = Clock::now() + 20s;
  while (got0.got.empty() && got1.failures.empty() && Clock::now() < deadline) {
    world0->poll(got0);
    world1->poll(got1);
    formed->poll(got1);
  }
  EXPECT_TRUE(got1.failures.empty()) << got1.failures.front().second;
  ASSERT_EQ(got0.got.size(), 1u) << "the world's message never arrived";
  std::vector<int> left;
  while (left.empty() && Clock::now() < deadline) {
    formed->poll(got1);
    left = formed->takeDisconnected();
  }
  EXPECT_EQ(left, std::vector<int>{0}) << "rank 0's leave message";
  formed.reset();
  while (links[0]->closedChannels() > 0 && Clock::now() < deadline) world0->poll(got0);
  EXPECT_EQ(links[0]->closedChannels(), 0u) << "rank 1's leave ends rank 0's record";
  world0.reset();
  world1.reset();
  links.clear();
}

}  // namespace
}  // namespace rdmacc
