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
      fmt::format("{} {}:9:1 {}:3:5", kC, kA, kB),  // rank 0 offers A first; rank 2 lacks A
      fmt::format("{} {}:0:2", kC, kB),
      fmt::format("{} {}:2:1", kC, kB),
  };
  const auto mine = offersOf(lines[2], {OfferedLink{kB, link, nullptr}});
  const auto choice = chooseLink(mine, lines, 2);
  ASSERT_TRUE(choice.has_value());
  EXPECT_EQ(choice->link, link);
  EXPECT_EQ(choice->channel, 5u) << "the largest of the members' next channels";
  EXPECT_EQ(choice->toBase, (std::vector<int>{3, 0, 2}));
}

TEST(SharedLinks, NoCommonLinkOrSharingOffMeansConnectionsOfItsOwn) {
  const std::vector<std::string> disjoint = {fmt::format("{} {}:0:1", kC, kA),
                                             fmt::format("{} {}:0:1", kC, kB)};
  EXPECT_FALSE(chooseLink(offersOf(disjoint[0]), disjoint, 0).has_value());
  EXPECT_EQ(foundingLinkId(disjoint), kC) << "rank 0's drawn id names the new link";
  const std::vector<std::string> off = {"-", "-"};
  EXPECT_FALSE(chooseLink(offersOf("-"), off, 0).has_value());
  EXPECT_EQ(foundingLinkId(off), "");
}

TEST(SharedLinks, AMalformedOfferFailsNamingItsRank) {
  auto net = std::make_shared<FakeNetwork>(2, 4, 256);
  auto link = std::make_shared<Link>(net->transport(0), 0, 2, 1 << 20);
  const std::string good = fmt::format("{} {}:0:1", kC, kA);
  const auto mine = offersOf(good, {OfferedLink{kA, link, nullptr}});
  for (const std::string& bad : {
           std::string("not-an-id"), fmt::format("{} {}:0", kC, kA),  // no next channel
           fmt::format("{} {}:-1:1", kC, kA),                         // negative link rank
           fmt::format("{} {}:0:1 {}:1:1", kC, kA, kA),               // one link twice
           fmt::format("{} {}:x:1", kC, kA),                          // not a number
           fmt::format("{}  {}:0:1", kC, kA),                         // an empty field
           fmt::format("- {}:0:1", kA),                               // offers while sharing is off
           fmt::format("{} {}:0:99999999999", kC, kA),                // past 32 bits
           fmt::format("{} {}:1:4294967295", kC, kA),  // the last channel: next would wrap
       }) {
    try {
      chooseLink(mine, {good, bad}, 0);
      ADD_FAILURE() << "accepted: " << bad;
    } catch (const Error& e) {
      EXPECT_EQ(e.info().peerRank, 1) << e.what();
      EXPECT_NE(std::string(e.what()).find("rank 1"), std::string::npos) << e.what();
    }
  }
  // Well formed, but naming a link rank another member has, or past the
  // link's ranks: the same check on every member, so every one fails.
  for (const std::string& clash :
       {fmt::format("{} {}:0:1", kC, kA), fmt::format("{} {}:7:1", kC, kA)}) {
    EXPECT_THROW(chooseLink(mine, {good, clash}, 0), Error) << clash;
  }
}

TEST(SharedLinks, AProcessOffersOnlyLinksMadeWithTheSameSettings) {
  auto net = std::make_shared<FakeNetwork>(2, 4, 256);
  auto link = std::make_shared<Link>(net->transport(1), 1, 2, 1 << 20);
  addLink(kB, "settings one", link, nullptr);
  {
    const LinkOffers same = offerLinks(true, "settings one");
    ASSERT_EQ(same.held.size(), 1u);
    EXPECT_NE(same.line.find(fmt::format(" {}:1:0", kB)), std::string::npos) << same.line;
  }
  EXPECT_TRUE(offerLinks(true, "settings two").held.empty());
  EXPECT_EQ(offerLinks(false, "settings one").line, "-");
  link.reset();
  EXPECT_TRUE(offerLinks(true, "settings one").held.empty()) << "held weakly";
}

}  // namespace
}  // namespace rdmacc
