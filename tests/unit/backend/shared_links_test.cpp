// What a forming group's ranks offer of their processes' shared
// connections, and the decision each takes from every rank's offers
// (src/backend/shared_links.hpp): the same on every member, and a
// malformed offer (hostile input from the store) fails naming its rank.
#include "src/backend/shared_links.hpp"

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "rdmacc/error.hpp"
#include "tests/unit/engine/fake_transport.hpp"

namespace rdmacc {
namespace {

using testing::FakeNetwork;

const std::string kA(32, 'a'), kB(32, 'b'), kC(32, 'c');

// A rank's offers as chooseLink sees them: this process holds `held`.
LinkOffers offersOf(std::string line, std::vector<OfferedLink> held = {}) {
  return LinkOffers{.line = std::move(line), .held = std::move(held)};
}

TEST(SharedLinks, MembersAttachToTheFirstLinkOfRankZerosThatEveryoneHas) {
  auto net = std::make_shared<FakeNetwork>(4, 4, 256);
  // This process is link rank 2 of link B (4 ranks); the group is ranks
  // 0..2 of it, in another order.
  auto link = std::make_shared<Link>(net->transport(2), 2, 4, 1 << 20);
  const std::vector<std::string> lines = {
      fmt::format("{} {}:9:1:-:- {}:3:7:-:-", kC, kA, kB),  // rank 0 offers A first; rank 2 lacks A
      fmt::format("{} {}:0:-:-:-", kC, kB),
      fmt::format("{} {}:2:-:-:-", kC, kB),
  };
  const auto mine = offersOf(lines[2], {OfferedLink{kB, link, nullptr}});
  const auto choice = chooseLink(mine, lines, 2);
  ASSERT_TRUE(choice.has_value());
  EXPECT_EQ(choice->link, link);
  EXPECT_EQ(choice->channel, 7u) << "the channel rank 0 drew";
  EXPECT_EQ(choice->toBase, (std::vector<int>{3, 0, 2}));
}

// Each member's board region rides its offer; the group has a board over
// the link when every member's offer has one, and each member writes its
// entries into the regions the others published, by group rank.
TEST(SharedLinks, TheGroupsBoardIsEveryMembersRegionOrNone) {
  auto net = std::make_shared<FakeNetwork>(2, 4, 256);
  auto link = std::make_shared<Link>(net->transport(1), 1, 2, 1 << 20);
  RemoteWrites::Region region{.addr = 0x5000, .rkey = 0x77};
  const auto mine = offersOf("", {OfferedLink{kA, link, nullptr, region}});
  const std::vector<std::string> both = {fmt::format("{} {}:0:2:a000:11", kC, kA),
                                         fmt::format("{} {}:1:-:5000:77", kC, kA)};
  const auto choice = chooseLink(mine, both, 1);
  ASSERT_TRUE(choice && choice->board);
  EXPECT_EQ(choice->board->mine.addr, 0x5000u);
  const std::vector<std::pair<uint64_t, uint32_t>> regions{{0xa000, 0x11}, {0x5000, 0x77}};
  EXPECT_EQ(choice->board->regions, regions);
  const std::vector<std::string> one = {fmt::format("{} {}:0:2:-:-", kC, kA), both[1]};
  const auto without = chooseLink(mine, one, 1);
  ASSERT_TRUE(without);
  EXPECT_FALSE(without->board) << "rank 0 registered none";
}

TEST(SharedLinks, NoCommonLinkOrSharingOffMeansConnectionsOfItsOwn) {
  const std::vector<std::string> disjoint = {fmt::format("{} {}:0:2:-:-", kC, kA),
                                             fmt::format("{} {}:0:-:-:-", kC, kB)};
  EXPECT_FALSE(chooseLink(offersOf(disjoint[0]), disjoint, 0).has_value());
  EXPECT_EQ(foundingLinkId(disjoint), kC) << "rank 0's drawn id names the new link";
  const std::vector<std::string> off = {"-", "-"};
  EXPECT_FALSE(chooseLink(offersOf("-"), off, 0).has_value());
  EXPECT_EQ(foundingLinkId(off), "");
}

TEST(SharedLinks, AMalformedOfferFailsNamingItsRank) {
  auto net = std::make_shared<FakeNetwork>(2, 4, 256);
  auto link = std::make_shared<Link>(net->transport(0), 0, 2, 1 << 20);
  const std::string good = fmt::format("{} {}:0:2:-:-", kC, kA);
  const auto mine = offersOf(good, {OfferedLink{kA, link, nullptr}});
  for (const std::string& bad : {
           std::string("not-an-id"), fmt::format("{} {}:1", kC, kA),  // no channel field
           fmt::format("{} {}:-1:-:-:-", kC, kA),                     // negative link rank
           fmt::format("{} {}:1:-:-:- {}:1:-:-:-", kC, kA, kA),       // one link twice
           fmt::format("{} {}:x:-:-:-", kC, kA),                      // not a number
           fmt::format("{}  {}:1:-:-:-", kC, kA),                     // an empty field
           fmt::format("- {}:1:-:-:-", kA),                           // offers while sharing is off
           fmt::format("{} {}:1:3:-:-", kC, kA),    // a channel from a rank other than 0
           fmt::format("{} {}:1:-:-", kC, kA),      // no rkey field
           fmt::format("{} {}:1:-:10:-", kC, kA),   // an address without an rkey
           fmt::format("{} {}:1:-:0:5", kC, kA),    // a null address
           fmt::format("{} {}:1:-:xyz:5", kC, kA),  // not hexadecimal
           fmt::format("{} {}:1:-:10000000000000000:5", kC, kA),  // past 64 bits
           fmt::format("{} {}:1:-:10:100000000", kC, kA),         // an rkey past 32 bits
       }) {
    try {
      chooseLink(mine, {good, bad}, 0);
      ADD_FAILURE() << "accepted: " << bad;
    } catch (const Error& e) {
      EXPECT_EQ(e.info().peerRank, 1) << e.what();
      EXPECT_NE(std::string(e.what()).find("rank 1"), std::string::npos) << e.what();
    }
  }
  // Rank 0's channel: past 32 bits, the founding group's, or one its link
  // rank does not draw (link rank 1's).
  const std::string second = fmt::format("{} {}:1:-:-:-", kC, kA);
  for (const std::string& bad :
       {fmt::format("{} {}:0:99999999999:-:-", kC, kA), fmt::format("{} {}:0:0:-:-", kC, kA),
        fmt::format("{} {}:0:3:-:-", kC, kA), fmt::format("{} {}:0:-:-:-", kC, kA)}) {
    try {
      chooseLink(mine, {bad, second}, 0);
      ADD_FAILURE() << "accepted: " << bad;
    } catch (const Error& e) {
      EXPECT_EQ(e.info().peerRank, 0) << e.what();
      EXPECT_NE(std::string(e.what()).find("rank 0"), std::string::npos) << e.what();
    }
  }
  // Well formed, but naming a link rank another member has, or past the
  // link's ranks: the same check on every member, so every one fails.
  for (const std::string& clash :
       {fmt::format("{} {}:0:-:-:-", kC, kA), fmt::format("{} {}:7:-:-:-", kC, kA)}) {
    EXPECT_THROW(chooseLink(mine, {good, clash}, 0), Error) << clash;
  }
}

// Two groups of the same two processes formed at once, from two threads of
// each in opposite orders (process 0 offers for A, then B; process 1 for B,
// then A): each group takes the channel its rank 0 drew, the same on both
// members and different from the other group's. With the members' largest
// next number, as before, both took channel 1 and mixed their messages.
TEST(SharedLinks, GroupsFormedAtOnceInOppositeOrdersTakeDifferentChannels) {
  auto net = std::make_shared<FakeNetwork>(2, 4, 256);
  auto link0 = std::make_shared<Link>(net->transport(0), 0, 2, 1 << 20);
  auto link1 = std::make_shared<Link>(net->transport(1), 1, 2, 1 << 20);
  // Process 1's offers as offerLinks makes them (the registry is this test
  // process's, which holds process 0's link).
  auto offers1 = [&](bool founder) {
    const std::string channel = founder ? std::to_string(*link1->allotChannel()) : "-";
    return offersOf(fmt::format("{} {}:1:{}:-:-", kC, kA, channel),
                    {OfferedLink{kA, link1, nullptr}});
  };
  addLink(kA, "opposite orders", link0, nullptr);
  // A's rank 0 is process 0 for the first pair; both groups have it as
  // rank 0 in the second (the same founder drawing twice).
  for (const bool sameFounder : {false, true}) {
    const LinkOffers a0 = offerLinks(true, "opposite orders", /*founder=*/true, 2);
    const LinkOffers b1 = offers1(/*founder=*/!sameFounder);
    const LinkOffers a1 = offers1(/*founder=*/false);
    const LinkOffers b0 = offerLinks(true, "opposite orders", /*founder=*/sameFounder, 2);
    const std::vector<std::string> aLines{a0.line, a1.line};
    const std::vector<std::string> bLines = sameFounder
                                                ? std::vector<std::string>{b0.line, b1.line}
                                                : std::vector<std::string>{b1.line, b0.line};
    const auto a = chooseLink(a0, aLines, 0), aThere = chooseLink(a1, aLines, 1);
    const auto b = chooseLink(b0, bLines, sameFounder ? 0 : 1);
    const auto bThere = chooseLink(b1, bLines, sameFounder ? 1 : 0);
    ASSERT_TRUE(a && aThere && b && bThere);
    EXPECT_EQ(a->channel, aThere->channel);
    EXPECT_EQ(b->channel, bThere->channel);
    EXPECT_NE(a->channel, b->channel) << "same founder: " << sameFounder;
  }
}

TEST(SharedLinks, AProcessOffersOnlyLinksMadeWithTheSameSettings) {
  auto net = std::make_shared<FakeNetwork>(2, 4, 256);
  auto link = std::make_shared<Link>(net->transport(1), 1, 2, 1 << 20);
  addLink(kB, "settings one", link, nullptr);
  {
    const LinkOffers same = offerLinks(true, "settings one", /*founder=*/true, 2);
    ASSERT_EQ(same.held.size(), 1u);
    EXPECT_NE(same.line.find(fmt::format(" {}:1:1:-:-", kB)), std::string::npos)
        << "link rank 1's first channel: " << same.line;
    const LinkOffers member = offerLinks(true, "settings one", /*founder=*/false, 2);
    EXPECT_NE(member.line.find(fmt::format(" {}:1:-:-:-", kB)), std::string::npos) << member.line;
  }
  EXPECT_TRUE(offerLinks(true, "settings two", true, 2).held.empty());
  EXPECT_EQ(offerLinks(false, "settings one", true, 2).line, "-");
  link.reset();
  EXPECT_TRUE(offerLinks(true, "settings one", true, 2).held.empty()) << "held weakly";
}

// A formation that fails on this rank before the group's decision leaves
// the board regions it offered to their links: a peer that read every
// record may have chosen one and write there.
TEST(SharedLinks, RegionsOfAFormationFailedBeforeTheDecisionStayWithTheirLinks) {
  auto net = std::make_shared<FakeNetwork>(2, 4, 256);
  net->setBoardBytes(16);
  auto link = std::make_shared<Link>(net->transport(1), 1, 2, 1 << 20);
  {
    auto offers = offersOf("", {OfferedLink{kA, link, nullptr, link->registerBoard(2)}});
    retireBoards(offers);
  }
  EXPECT_EQ(net->liveRegions(1), 1u);
  link.reset();
  EXPECT_EQ(net->liveRegions(1), 0u);
}

// A group that chose a channel and failed on this rank before opening it
// closes it as if it had opened (Link::abandon); one that opened it leaves
// that to the channel.
TEST(SharedLinks, AClaimOnAChannelNeverOpenedHereClosesIt) {
  auto net = std::make_shared<FakeNetwork>(2, 4, 256);
  auto link = std::make_shared<Link>(net->transport(1), 1, 2, 1 << 20);
  const uint32_t tag = Link::groupTag("claimed");
  { ChannelClaim failed(link, 3, {0, 1}, tag, nullptr); }
  EXPECT_EQ(link->closedChannels(), 1u) << "rank 0's leave is awaited";
  EXPECT_EQ(net->messages(1, 0), 1) << "rank 0 is told";
  {
    ChannelClaim formed(link, 5, {0, 1}, tag, nullptr);
    auto channel = link->open(5, 1, {0, 1}, tag);
    formed.opened();
  }
  EXPECT_EQ(link->closedChannels(), 2u) << "closed by its channel";
  EXPECT_EQ(net->messages(1, 0), 2);
}

}  // namespace
}  // namespace rdmacc
