#include "src/transport/credits.hpp"

#include <cstring>

#include "rdmacc/error.hpp"
#include "src/transport/slot_window.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

namespace rdmacc {
namespace {

std::vector<int> decode(uint32_t imm) {
  std::vector<int> slots;
  credits::forEach(imm, [&](int slot) { slots.push_back(slot); });
  return slots;
}

TEST(Credits, OneMessageHandsBackEverySlotOfAGroup) {
  std::vector<int> pending{3, 17, 5, 40, 16, 0, 15};
  uint32_t first = credits::take(pending);
  EXPECT_TRUE(credits::isCredit(first));
  EXPECT_EQ(decode(first), (std::vector<int>{0, 3, 5, 15}));
  EXPECT_EQ(pending, (std::vector<int>{17, 40, 16}));
  EXPECT_EQ(decode(credits::take(pending)), (std::vector<int>{16, 17}));
  EXPECT_EQ(decode(credits::take(pending)), (std::vector<int>{40}));
  EXPECT_TRUE(pending.empty());
}

TEST(Credits, EverySlotUpToTheLimitRoundTrips) {
  for (int slot : {0, 1, 15, 16, 63, 64, 4095, credits::kMaxSlots - 1}) {
    std::vector<int> pending{slot};
    uint32_t imm = credits::take(pending);
    EXPECT_TRUE(credits::isCredit(imm)) << slot;
    EXPECT_EQ(decode(imm), std::vector<int>{slot});
  }
  // A data message's immediate is its slot: never taken for a credit.
  EXPECT_FALSE(credits::isCredit(0xffffu));
}

TEST(Credits, AFullGroupFitsOneMessage) {
  std::vector<int> pending;
  for (int slot = 47; slot >= 32; --slot) pending.push_back(slot);
  std::vector<int> all = decode(credits::take(pending));
  EXPECT_TRUE(pending.empty());
  ASSERT_EQ(all.size(), 16u);
  EXPECT_TRUE(std::is_sorted(all.begin(), all.end()));
  EXPECT_EQ(all.front(), 32);
  EXPECT_EQ(all.back(), 47);
}

// A slot released twice would hand its credit back twice, and the peer would
// overwrite the next message in it: SlotWindow refuses the second release.
TEST(SlotWindow, ASlotReleasedTwiceIsRefused) {
  constexpr int kSlots = 16;
  const wire::Limits limits{.slotsPerPeer = kSlots, .slotBytes = 256};
  std::vector<uint8_t> region(kSlots * limits.slotBytes, 0);
  wire::Header h;
  std::memcpy(region.data() + 3 * limits.slotBytes, &h, sizeof h);
  SlotWindow window(kSlots);
  uint64_t arrivals = 0;
  Incoming in;
  bool isMessage = false;
  const wire::Completion c{
      .rdmaWriteWithImm = true, .withImm = true, .imm = 3, .byteLen = wire::kHeaderBytes};
  ASSERT_FALSE(window.accept(c, region.data(), limits, arrivals, in, isMessage));
  ASSERT_TRUE(isMessage);
  window.release(3);
  EXPECT_THROW(window.release(3), Error);  // before its credit went back
  window.takeCreditMessage();
  EXPECT_THROW(window.release(3), Error);  // after
  EXPECT_THROW(window.release(7), Error);  // a slot that never held a message
}

}  // namespace
}  // namespace rdmacc
