#include <gtest/gtest.h>

#include "src/transport/rdma/transport.hpp"

using namespace rdmacc;

TEST(SlotSizing, SmallGroupsGetLargeSlots) {
  EXPECT_EQ(autoSlotBytes(1, 16), 256u << 10);
  EXPECT_EQ(autoSlotBytes(2, 16), 256u << 10);  // 2 x 1 x 16 x 256 KiB = 8 MiB
  EXPECT_EQ(autoSlotBytes(5, 16), 256u << 10);  // exactly 32 MiB
}

TEST(SlotSizing, LargerGroupsAndMoreSlotsStayWithinTheBudget) {
  EXPECT_EQ(autoSlotBytes(6, 16), 128u << 10);
  EXPECT_EQ(autoSlotBytes(16, 16), 64u << 10);
  EXPECT_EQ(autoSlotBytes(2, 64), 256u << 10);  // exactly 32 MiB
  EXPECT_EQ(autoSlotBytes(2, 128), 128u << 10);
  for (int ranks : {2, 3, 8, 9, 17, 33, 64}) {
    for (int slots : {1, 4, 16, 32}) {
      size_t bytes = autoSlotBytes(ranks, slots);
      EXPECT_EQ(bytes & (bytes - 1), 0u) << ranks << " ranks, " << slots << " slots";
      if (bytes > (16u << 10)) {
        EXPECT_LE(2 * size_t(ranks - 1) * size_t(slots) * bytes, size_t{32} << 20)
            << ranks << " ranks, " << slots << " slots";
      }
    }
  }
}

TEST(SlotSizing, VeryLargeGroupsKeepAUsableFloorAboveTheBudget) {
  EXPECT_EQ(autoSlotBytes(1024, 16), 16u << 10);
  EXPECT_EQ(autoSlotBytes(64, 32), 16u << 10);
}
