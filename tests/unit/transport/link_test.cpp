// Groups sharing one process pair's connections (src/transport/link.hpp):
// the engines of several groups per rank over one FakeNetwork, each group
// through its channel of the rank's Link. The slots a test fills are the
// link's, so what one group leaves in them shows in the other's traffic.
#include "src/transport/link.hpp"

#include <gtest/gtest.h>
#include <poll.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <numeric>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "rdmacc/error.hpp"
#include "src/engine/engine.hpp"
#include "src/schedule/algorithms/algorithms.hpp"
#include "src/schedule/schedule.hpp"
#include "tests/unit/engine/fake_transport.hpp"
#include "tests/unit/engine/test_operations.hpp"
#include "tests/unit/transport/links.hpp"

namespace rdmacc {
namespace {

using namespace std::chrono_literals;
using namespace rdmacc::testing;  // FakeNetwork and the operations

// The descriptors a channel's thread would sleep on now (after arm()).
std::vector<int> sleepsOn(const Transport& channel) {
  std::vector<int> fds;
  for (int fd : channel.eventFds()) {
    if (fd >= 0) fds.push_back(fd);
  }
  return fds;
}

// Whether a channel's own wake-up descriptor (its last) is set.
bool woken(const Transport& channel) {
  pollfd wake{sleepsOn(channel).back(), POLLIN, 0};
  return ::poll(&wake, 1, 0) == 1;
}

// The world (4 ranks) and two pairs, {0, 2} and {1, 3}, on one link per
// rank: their allreduces run at once over the same slots, and each group
// gets its own sum.
TEST(Link, GroupsRunAtOnceOverTheSameSlots) {
  constexpr int kSize = 4;
  constexpr size_t kValues = 3000;  // several chunks per step
  Links links(kSize, /*slots=*/4, /*slotBytes=*/512);
  const std::vector<int> world{0, 1, 2, 3};
  const std::vector<std::vector<int>> pairs{{0, 2}, {1, 3}};
  std::vector<std::unique_ptr<Engine>> engines;
  for (int r = 0; r < kSize; ++r) engines.push_back(links.engine(0, world, r));
  for (const auto& pair : pairs) {
    for (int r = 0; r < 2; ++r) engines.push_back(links.engine(1, pair, r));
  }
  std::vector<std::vector<int32_t>> data;
  for (int r = 0; r < kSize; ++r) data.push_back(input(0, r, kValues));
  for (int p = 0; p < 2; ++p) {
    for (int r = 0; r < 2; ++r) data.push_back(input(1 + p, r, kValues));
  }
  for (int round = 0; round < 3; ++round) {
    std::vector<std::vector<int32_t>> work = data;
    std::vector<std::shared_ptr<Work>> works;
    for (int r = 0; r < kSize; ++r)
      works.push_back(engines[r]->submit(ringAllreduce(r, 4, work[r])));
    for (int e = kSize; e < kSize + 4; ++e) {
      works.push_back(engines[e]->submit(ringAllreduce((e - kSize) % 2, 2, work[e])));
    }
    for (auto& w : works) ASSERT_TRUE(w->wait());
    for (size_t i = 0; i < kValues; ++i) {
      const int32_t worldSum = static_cast<int32_t>(4 * i + 60);
      for (int r = 0; r < kSize; ++r) ASSERT_EQ(work[r][i], worldSum) << "world rank " << r;
      for (int p = 0; p < 2; ++p) {
        const int32_t pairSum = static_cast<int32_t>(2 * i + 200 * (1 + p) + 10);
        for (int r = 0; r < 2; ++r) {
          ASSERT_EQ(work[kSize + 2 * p + r][i], pairSum) << "pair " << p << " rank " << r;
        }
      }
    }
  }
  for (int a = 0; a < kSize; ++a) {
    for (int b = 0; b < kSize; ++b) {
      if (a != b) {
        EXPECT_LE(links.net->maxOccupied(a, b), 4) << a << " -> " << b;
      }
    }
  }
}

// A two-rank group's ring allreduce still completes with equal results.
void expectAllreduceWorks(Engine& rank0, Engine& rank1) {
  std::vector<int32_t> a = input(0, 0, 500), b = input(0, 1, 500);
  auto wa = rank0.submit(ringAllreduce(0, 2, a));
  auto wb = rank1.submit(ringAllreduce(1, 2, b));
  EXPECT_TRUE(wa->wait());
  EXPECT_TRUE(wb->wait());
  EXPECT_EQ(a, b);
}

TEST(Link, AnAbortInOneGroupLeavesTheOthersWorking) {
  Links links(2, 4, 512);
  const std::vector<int> both{0, 1};
  auto world0 = links.engine(0, both, 0), world1 = links.engine(0, both, 1);
  auto sub0 = links.engine(1, both, 0), sub1 = links.engine(1, both, 1);
  auto waiting = sub1->submit(barrier(1, 2, 20s));
  sub0->abort("the test aborts the subgroup");
  const Error e = failureOf(*waiting);
  EXPECT_NE(std::string(e.what()).find("the test aborts the subgroup"), std::string::npos)
      << e.what();
  expectAllreduceWorks(*world0, *world1);
}

TEST(Link, AFailedConnectionFailsEveryGroupOnIt) {
  Links links(2, 4, 512);
  const std::vector<int> both{0, 1};
  auto world0 = links.engine(0, both, 0), world1 = links.engine(0, both, 1);
  auto sub0 = links.engine(1, both, 0), sub1 = links.engine(1, both, 1);
  std::vector<uint8_t> in(64), in2(64);
  auto a = world0->submit(pointToPoint(false, 1, 4, in, 60s));
  auto b = sub0->submit(pointToPoint(false, 1, 4, in2, 60s));
  links.net->failTransfer(0, 1, "IBV_WC_RETRY_EXC_ERR on the fake link");
  for (auto* w : {&a, &b}) {
    const Error e = failureOf(**w);
    EXPECT_NE(std::string(e.what()).find("IBV_WC_RETRY_EXC_ERR on the fake link"),
              std::string::npos)
        << e.what();
  }
}

// A group destroyed on one rank: its peers there learn it at once, as from
// a group's own connections closing (not at their timeout); the other
// groups on the link keep the rank.
TEST(Link, AGroupDestroyedOnARankFailsWhatWaitsForItThere) {
  Links links(2, 4, 512);
  const std::vector<int> both{0, 1};
  auto world0 = links.engine(0, both, 0), world1 = links.engine(0, both, 1);
  auto sub0 = links.engine(1, both, 0), sub1 = links.engine(1, both, 1);
  std::vector<uint8_t> in(64);
  auto waiting = sub0->submit(pointToPoint(false, 1, 4, in, 60s));
  sub1.reset();
  const Error e = failureOf(*waiting);
  EXPECT_EQ(e.info().kind, ErrorKind::PeerFailure);
  EXPECT_NE(std::string(e.what()).find("rank 1 disconnected"), std::string::npos) << e.what();
  EXPECT_NE(std::string(e.what()).find("its group (channel 1) was destroyed there"),
            std::string::npos)
      << e.what();
  expectAllreduceWorks(*world0, *world1);
}

// The group was formed and destroyed on rank 1 before rank 0 formed it:
// the leave message waits with the early ones and counts when it opens.
TEST(Link, AGroupDestroyedBeforeAPeerFormedItIsGoneThereFromTheStart) {
  Links links(2, 4, 256);
  auto world0 = links.of[0]->open(0, 0, {0, 1});
  auto world1 = links.of[1]->open(0, 1, {0, 1});
  links.of[1]->open(1, 1, {0, 1}).reset();
  Arrivals got;
  world0->poll(got);
  auto late = links.of[0]->open(1, 0, {0, 1});
  EXPECT_EQ(late->takeDisconnected(), std::vector<int>{1});
  EXPECT_EQ(links.of[0]->earlyCopies(), 0u);
  EXPECT_TRUE(world0->takeDisconnected().empty());
  late->poll(got);
  EXPECT_TRUE(got.got.empty());
}

// A link peer that names the channel of a group it is not in before this
// rank opened it: dropped when it opens, as after (a group would otherwise
// take it as from no rank of its own).
TEST(Link, AnEarlyMessageFromARankOutsideTheGroupIsDropped) {
  Links links(3, /*slots=*/2, /*slotBytes=*/256);
  auto intruder = links.of[2]->open(1, 0, {2, 0});  // rank 2 claims channel 1 with rank 0
  auto world0 = links.of[0]->open(0, 0, {0, 1, 2});
  const wire::Header h{.kind = wire::MessageKind::PointToPoint, .sequence = 9};
  ASSERT_TRUE(intruder->trySend(1, h, nullptr));
  Arrivals got;
  world0->poll(got);  // early for channel 1
  auto pair = links.of[0]->open(1, 0, {0, 1});
  pair->poll(got);
  EXPECT_TRUE(got.got.empty());
  EXPECT_EQ(links.of[0]->heldSlots(2), 0u);
  EXPECT_EQ(links.of[0]->earlyCopies(), 0u);
}

// Rank 0 forms the subgroup and sends before rank 1 opened it: the messages
// wait, copied out of their slots, and are received once it opens.
TEST(Link, MessagesForAGroupNotOpenYetWaitForIt) {
  Links links(2, /*slots=*/2, /*slotBytes=*/256);
  const std::vector<int> both{0, 1};
  auto sub0 = links.engine(1, both, 0);  // rank 0 has no world here
  std::vector<std::vector<uint8_t>> sent, received;
  std::vector<std::shared_ptr<Work>> sends;
  for (int m = 0; m < 5; ++m) {  // more than rank 1's two slots for rank 0
    sent.emplace_back(150, static_cast<uint8_t>(m + 1));
    received.emplace_back(150, 0);
  }
  for (auto& s : sent) sends.push_back(sub0->submit(pointToPoint(true, 1, 9, s)));
  // Rank 1 polls through the world's channel meanwhile: its poll takes the
  // subgroup's messages off the slots.
  auto world1 = links.engine(0, both, 1);
  const auto until = std::chrono::steady_clock::now() + 10s;
  while (links.of[1]->earlyCopies() < 5 && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(1ms);
  }
  EXPECT_EQ(links.of[1]->earlyCopies(), 5u);
  EXPECT_EQ(links.of[1]->heldSlots(0), 0u);
  auto sub1 = links.engine(1, both, 1);
  for (auto& r : received) EXPECT_TRUE(sub1->submit(pointToPoint(false, 0, 9, r))->wait());
  for (auto& w : sends) EXPECT_TRUE(w->wait());
  EXPECT_EQ(received, sent);
}

// Early messages count at least a header each against the budget: a peer's
// empty messages for a group not open here are copied out only up to it,
// the rest keep their slots (and so stop the sender), and all are received
// once the group opens. Without the floor every empty message was copied
// out and its slot given back: the copies grew without bound.
TEST(Link, EarlyEmptyMessagesAreBoundedToo) {
  constexpr size_t kBudget = 4 * wire::kHeaderBytes;
  Links links(2, /*slots=*/2, /*slotBytes=*/256, kBudget);
  const std::vector<int> both{0, 1};
  auto sub0 = links.engine(1, both, 0);
  std::vector<std::vector<uint8_t>> empty(20);
  std::vector<std::shared_ptr<Work>> sends;
  for (auto& e : empty) sends.push_back(sub0->submit(pointToPoint(true, 1, 3, e)));
  auto world1 = links.engine(0, both, 1);
  const auto until = std::chrono::steady_clock::now() + 10s;
  while ((links.of[1]->earlyCopies() < 4 || links.of[1]->heldSlots(0) < 2) &&
         std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(1ms);
  }
  std::this_thread::sleep_for(50ms);  // room for a copy past the budget to show
  EXPECT_EQ(links.of[1]->earlyCopies(), 4u);
  EXPECT_EQ(links.of[1]->heldSlots(0), 2u);
  auto sub1 = links.engine(1, both, 1);
  std::vector<std::vector<uint8_t>> received(20);
  for (auto& r : received) EXPECT_TRUE(sub1->submit(pointToPoint(false, 0, 3, r))->wait());
  for (auto& w : sends) EXPECT_TRUE(w->wait());
  EXPECT_EQ(links.of[1]->earlyCopies(), 0u);
}

// A group destroyed with messages in its slots gives them back, or the
// other groups would lose them for good. (Three of eight: below the half
// at which the subgroup would copy them out itself.)
TEST(Link, AGroupThatGoesGivesItsSlotsBack) {
  Links links(2, /*slots=*/8, /*slotBytes=*/256);
  const std::vector<int> both{0, 1};
  auto world0 = links.engine(0, both, 0), world1 = links.engine(0, both, 1);
  {
    auto sub0 = links.engine(1, both, 0), sub1 = links.engine(1, both, 1);
    std::vector<std::vector<uint8_t>> messages(3, std::vector<uint8_t>(100, 1));
    std::vector<std::shared_ptr<Work>> sends;
    for (auto& m : messages) sends.push_back(sub0->submit(pointToPoint(true, 1, 3, m)));
    for (auto& w : sends) EXPECT_TRUE(w->wait());
    const auto until = std::chrono::steady_clock::now() + 10s;
    while (links.of[1]->heldSlots(0) < 3 && std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(1ms);
    }
    ASSERT_EQ(links.of[1]->heldSlots(0), 3u);
  }  // destroyed without receiving them
  EXPECT_EQ(links.of[1]->heldSlots(0), 0u);
  std::vector<uint8_t> out(3000, 5), in(3000, 0);
  auto send = world0->submit(pointToPoint(true, 1, 1, out, 10s));
  auto recv = world1->submit(pointToPoint(false, 0, 1, in, 10s));
  EXPECT_TRUE(recv->wait());
  EXPECT_TRUE(send->wait());
  EXPECT_EQ(in, out);
}

// The subgroup's messages fill every slot of rank 1 for rank 0 before the
// world's allreduce, and rank 1 receives them only after it: the world can
// send nothing unless the subgroup copies them out, which it does although
// it waits for nothing itself (the slots are contended).
TEST(Link, OneGroupsUnreceivedMessagesDoNotBlockAnother) {
  Links links(2, /*slots=*/4, /*slotBytes=*/256);
  const std::vector<int> both{0, 1};
  auto world0 = links.engine(0, both, 0), world1 = links.engine(0, both, 1);
  auto sub0 = links.engine(1, both, 0), sub1 = links.engine(1, both, 1);
  std::vector<std::vector<uint8_t>> sent, received;
  std::vector<std::shared_ptr<Work>> sends;
  for (int m = 0; m < 6; ++m) {
    sent.emplace_back(150, static_cast<uint8_t>(m + 1));
    received.emplace_back(150, 0);
  }
  for (auto& s : sent) sends.push_back(sub0->submit(pointToPoint(true, 1, 3, s, 10s)));
  std::this_thread::sleep_for(50ms);  // they reach rank 1 first
  std::vector<int32_t> a = input(0, 0, 2000), b = input(0, 1, 2000);
  auto wa = world0->submit(ringAllreduce(0, 2, a, 10s));
  auto wb = world1->submit(ringAllreduce(1, 2, b, 10s));
  ASSERT_TRUE(wa->wait());
  ASSERT_TRUE(wb->wait());
  EXPECT_EQ(a, b);
  for (auto& r : received) EXPECT_TRUE(sub1->submit(pointToPoint(false, 0, 3, r))->wait());
  for (auto& w : sends) EXPECT_TRUE(w->wait());
  EXPECT_EQ(received, sent);
}

// One thread per link sleeps on the completion channel, a busy group's if
// any: else every completion would wake two threads, or an idle group's
// thread would hand the busy group each message. A group that goes to
// sleep while another group's thread polls the link or sleeps on the
// channel, and is idle or that one is busy too, waits on its own eventfd,
// to which the other thread hands its arrivals.
TEST(Link, OneSleeperPerLinkWaitsOnTheCompletionChannel) {
  Links links(2, /*slots=*/4, /*slotBytes=*/256);
  auto world = links.of[0]->open(0, 0, {0, 1});
  auto sub = links.of[0]->open(1, 0, {0, 1});
  auto peerWorld = links.of[1]->open(0, 1, {0, 1});
  const size_t all = sleepsOn(*world).size();  // the fake's descriptor and the channel's
  Arrivals worldGot, subGot;
  size_t arms = links.net->arms(0);
  // An idle group relies on a thread that polls.
  sub->poll(subGot);
  world->arm();
  EXPECT_EQ(links.net->arms(0), arms);
  EXPECT_EQ(sleepsOn(*world).size(), 1u);  // its eventfd only
  const wire::Header h{.kind = wire::MessageKind::PointToPoint, .sequence = 7};
  ASSERT_TRUE(peerWorld->trySend(0, h, nullptr));
  sub->poll(subGot);
  EXPECT_TRUE(subGot.got.empty());
  EXPECT_TRUE(woken(*world));
  world->consumeEvents();
  world->poll(worldGot);
  ASSERT_EQ(worldGot.got.size(), 1u);
  EXPECT_EQ(worldGot.got[0].second.header.sequence, 7u);
  world->release(1, worldGot.got[0].second.slot);
  // Alone (the poll is past the gap), it sleeps on the channel itself.
  std::this_thread::sleep_for(3ms);
  world->arm();
  EXPECT_EQ(links.net->arms(0), ++arms);
  EXPECT_EQ(sleepsOn(*world).size(), all);
  // A busy group takes the channel from an idle one, which is woken to
  // sleep again relying on it.
  ASSERT_TRUE(sub->trySend(1, h, nullptr));
  EXPECT_FALSE(woken(*world));
  sub->arm();
  EXPECT_EQ(links.net->arms(0), ++arms);
  EXPECT_EQ(sleepsOn(*sub).size(), all);
  EXPECT_TRUE(woken(*world));
  world->consumeEvents();
  world->arm();
  EXPECT_EQ(links.net->arms(0), arms);
  EXPECT_EQ(sleepsOn(*world).size(), 1u);
  // A busy group does not rely on an idle group's thread.
  sub->consumeEvents();
  world->consumeEvents();
  world->poll(worldGot);
  sub->arm();
  EXPECT_EQ(links.net->arms(0), ++arms);
  sub->disarm();
}

// An idle group stepped beside a busy one whose thread polls (the engine
// thread while a caller drives the busy group) leaves the link to that
// thread: polling it, it would take the busy group's arrivals and hand each
// over, a wake-up and a contended lock per message.
TEST(Link, AnIdleGroupLeavesTheLinkToABusyGroupsPoller) {
  Links links(2, /*slots=*/4, /*slotBytes=*/256);
  auto world = links.of[0]->open(0, 0, {0, 1});
  auto sub = links.of[0]->open(1, 0, {0, 1});
  auto peerSub = links.of[1]->open(1, 1, {0, 1});
  Arrivals worldGot, subGot;
  const wire::Header h{.kind = wire::MessageKind::PointToPoint, .sequence = 5};
  ASSERT_TRUE(sub->trySend(1, h, nullptr));  // busy
  sub->poll(subGot);                         // and polling
  ASSERT_TRUE(peerSub->trySend(0, h, nullptr));
  EXPECT_FALSE(world->poll(worldGot));
  EXPECT_FALSE(woken(*sub));  // nothing was handed over
  sub->poll(subGot);
  ASSERT_EQ(subGot.got.size(), 1u);
  sub->release(1, subGot.got[0].second.slot);
  // A poller that stopped (past the gap) is not relied on.
  std::this_thread::sleep_for(3ms);
  ASSERT_TRUE(peerSub->trySend(0, h, nullptr));
  world->poll(worldGot);
  EXPECT_TRUE(woken(*sub));
  EXPECT_TRUE(worldGot.got.empty());
}

// The founding group's zero-copy write may complete in another group's
// poll (while its own thread does not poll the link): its record is
// changed there (locked: its own thread reads it meanwhile), and the
// founding group is woken to see the write done.
TEST(Link, AZeroCopyWriteCompletedInAnotherGroupsPollWakesItsGroup) {
  Links links(2, /*slots=*/4, /*slotBytes=*/256);
  links.net->setZeroCopy(0, true);
  auto world = links.of[0]->open(0, 0, {0, 1});
  auto sub = links.of[0]->open(1, 0, {0, 1});
  Arrivals worldGot, subGot;
  const std::vector<uint8_t> data(100, 3);
  auto writes = std::make_shared<ZeroCopyWrites>();
  const wire::Header h{.kind = wire::MessageKind::PointToPoint, .sequence = 2, .payload = 100};
  ASSERT_TRUE(world->trySend(1, h, data.data(), writes));
  world->poll(worldGot);  // the write is still in flight
  ASSERT_FALSE(writes->empty());
  world->consumeEvents();
  // Its thread stopped polling the link (past the gap), busy elsewhere.
  std::this_thread::sleep_for(3ms);
  std::thread other([&] { sub->poll(subGot); });
  const auto until = std::chrono::steady_clock::now() + 10s;
  while (!writes->empty() && std::chrono::steady_clock::now() < until) {
    (void)writes->overlaps(data.data(), data.size());  // as its executor does
  }
  other.join();
  EXPECT_TRUE(writes->empty());
  EXPECT_TRUE(woken(*world));
}

// A link peer that names the channel of a group it is not in: its messages
// are dropped and their slots go back (they would otherwise fill this rank's
// slots with messages no group takes, or reach a group as from no rank).
TEST(Link, AMessageOnAChannelItsSenderIsNotInIsDropped) {
  Links links(3, /*slots=*/2, /*slotBytes=*/256);
  auto pair = links.of[0]->open(1, 0, {0, 1});      // ranks 0 and 1
  auto intruder = links.of[2]->open(1, 0, {2, 0});  // rank 2 claims it with rank 0
  Arrivals got;
  const wire::Header h{.kind = wire::MessageKind::PointToPoint, .sequence = 1};
  for (int m = 0; m < 5; ++m) {  // more than rank 0's two slots for rank 2
    ASSERT_TRUE(intruder->trySend(1, h, nullptr)) << "message " << m;
    pair->poll(got);
  }
  EXPECT_TRUE(got.got.empty());
  EXPECT_EQ(links.of[0]->heldSlots(2), 0u);
  EXPECT_EQ(links.net->messages(2, 0), 5);
}

// A peer that took a channel this rank opened for another group (a process
// that numbers channels otherwise: allotChannel rules it out for this
// rdmacc) sends messages of another group there: they fail the receiving
// group, before the channel opened here too, instead of being received as
// its own.
TEST(Link, TwoGroupsOnOneChannelFailInsteadOfMixingTheirMessages) {
  Links links(2, /*slots=*/2, /*slotBytes=*/256);
  const uint32_t a = Link::groupTag("group-a"), b = Link::groupTag("group-b");
  ASSERT_NE(a, b);
  auto a0 = links.of[0]->open(1, 0, {0, 1}, a);
  const wire::Header h{.kind = wire::MessageKind::PointToPoint, .sequence = 1};
  ASSERT_TRUE(a0->trySend(1, h, nullptr));  // early at rank 1
  Arrivals got;
  auto world1 = links.of[1]->open(0, 1, {0, 1});
  world1->poll(got);
  auto b1 = links.of[1]->open(1, 1, {0, 1}, b);
  b1->poll(got);
  ASSERT_TRUE(got.got.empty()) << "a message of group A was received by group B";
  ASSERT_EQ(got.failures.size(), 1u);
  EXPECT_EQ(got.failures[0].first, 0);
  EXPECT_NE(got.failures[0].second.find("its process took the channel for another group"),
            std::string::npos)
      << got.failures[0].second;
  // After the open too, and the other way.
  ASSERT_TRUE(b1->trySend(0, h, nullptr));
  Arrivals atRank0;
  a0->poll(atRank0);
  EXPECT_TRUE(atRank0.got.empty());
  ASSERT_EQ(atRank0.failures.size(), 1u);
  EXPECT_EQ(atRank0.failures[0].first, 1);
  EXPECT_EQ(links.of[0]->heldSlots(1), 0u);
  EXPECT_EQ(links.of[1]->earlyCopies(), 0u);
}

// A group that goes while its peer's slots here are all held (by another
// group's messages it has not released) tells that peer once one is free,
// not at the peer's timeout.
TEST(Link, ALeaveMessageWaitsForAFreeSlot) {
  WorldAndPair g;
  auto& [links, world0, world1, pair0, pair1] = g;
  const wire::Header h{.kind = wire::MessageKind::PointToPoint, .sequence = 1};
  ASSERT_TRUE(world0->trySend(1, h, nullptr));
  ASSERT_TRUE(world0->trySend(1, h, nullptr));
  ASSERT_FALSE(world0->trySend(1, h, nullptr)) << "rank 1's two slots for rank 0 are taken";
  pair0.reset();  // its leave message finds no slot free
  Arrivals world;
  world1->poll(world);
  ASSERT_EQ(world.got.size(), 2u);
  Arrivals pair;
  pair1->poll(pair);
  EXPECT_TRUE(pair1->takeDisconnected().empty());
  for (const auto& [peer, in] : world.got) world1->release(peer, in.slot);
  world.got.clear();
  world0->poll(world);  // rank 0's next poll sends it
  world1->poll(world);  // rank 1's takes it to the pair's channel
  pair1->poll(pair);
  EXPECT_TRUE(world.got.empty());
  EXPECT_TRUE(pair.got.empty());
  EXPECT_EQ(pair1->takeDisconnected(), std::vector<int>{0});
  EXPECT_EQ(pair1->departure(0).status, "its group (channel 1) was destroyed there");
}

TEST(Link, AChannelIsOpenedOncePerLink) {
  Links links(2, 2, 256);
  auto first = links.of[0]->open(3, 0, {0, 1});
  EXPECT_THROW(links.of[0]->open(3, 0, {0, 1}), Error);
  first.reset();  // closed here; rank 1 has not left it
  EXPECT_THROW(links.of[0]->open(3, 0, {0, 1}), Error);
  EXPECT_NO_THROW(links.of[0]->open(5, 0, {0, 1}));
  EXPECT_THROW(links.of[0]->open(7, 0, {1, 0}), Error);  // this process is link rank 0
}

// Each link rank draws the numbers of the groups it founds from its own
// residue class: no two members ever draw the same, however their threads
// interleave, and none draws the founding group's 0.
TEST(Link, ChannelNumbersAreTheirFoundersOwnAndDrawnOnce) {
  constexpr int kSize = 3;
  Links links(kSize, 2, 256);
  std::set<uint32_t> drawn;
  for (int round = 0; round < 4; ++round) {
    for (int r = 0; r < kSize; ++r) {
      const auto channel = links.of[static_cast<size_t>(r)]->allotChannel();
      ASSERT_TRUE(channel.has_value());
      EXPECT_TRUE(Link::foundedBy(*channel, r, kSize)) << *channel << " drawn by " << r;
      EXPECT_TRUE(drawn.insert(*channel).second) << *channel << " drawn twice";
    }
  }
  EXPECT_FALSE(drawn.contains(0u));
  EXPECT_FALSE(Link::foundedBy(0, 0, kSize));
  EXPECT_FALSE(Link::foundedBy(4, 0, kSize)) << "link rank 1's";
}

// A group closed here drops what its peers still send it (not kept as
// early messages of a group to come), and forgets the channel once every
// member has sent its leave message: nothing can follow that.
TEST(Link, AClosedChannelDropsLateMessagesUntilEveryMemberLeft) {
  WorldAndPair g;
  auto& [links, world0, world1, pair0, pair1] = g;
  pair0.reset();
  EXPECT_EQ(links.of[0]->closedChannels(), 1u);
  const wire::Header h{.kind = wire::MessageKind::PointToPoint, .sequence = 1};
  ASSERT_TRUE(pair1->trySend(0, h, nullptr));
  Arrivals got;
  world0->poll(got);
  EXPECT_TRUE(got.got.empty());
  EXPECT_EQ(links.of[0]->earlyCopies(), 0u) << "kept for a group to come";
  EXPECT_EQ(links.of[0]->heldSlots(1), 0u);
  EXPECT_EQ(links.of[0]->closedChannels(), 1u);
  pair1.reset();  // its leave message
  world0->poll(got);
  EXPECT_EQ(links.of[0]->closedChannels(), 0u);
  EXPECT_TRUE(got.got.empty());
}

}  // namespace
}  // namespace rdmacc
