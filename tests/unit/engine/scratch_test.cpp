// Operations' scratch memory: large buffers go back to the pool and serve
// later operations (smallest fit first), within the pool's limits.
#include <gtest/gtest.h>

#include <memory>

#include "src/engine/scratch.hpp"

namespace rdmacc {
namespace {

constexpr size_t kLarge = ScratchPool::kPooledMinBytes;

TEST(Scratch, ALargeBufferReturnsToThePoolAndServesTheNextOperation) {
  auto pool = std::make_shared<ScratchPool>(size_t{1} << 30);
  uint8_t* first = nullptr;
  {
    Scratch s;
    first = s.allocate(4 * kLarge, pool);
    ASSERT_NE(first, nullptr);
    EXPECT_EQ(s.size(), 4 * kLarge);
    first[4 * kLarge - 1] = 7;  // all of it is usable
    EXPECT_EQ(pool->keptBytes(), 0u);
  }
  EXPECT_EQ(pool->keptBytes(), 4 * kLarge);
  Scratch again;
  EXPECT_EQ(again.allocate(3 * kLarge, pool), first);  // a smaller request fits it
  EXPECT_EQ(again.size(), 3 * kLarge);
  EXPECT_EQ(pool->keptBytes(), 0u);
}

TEST(Scratch, SmallBuffersAndAnEmptyPoolAreNotKept) {
  auto pool = std::make_shared<ScratchPool>(size_t{1} << 30);
  {
    Scratch s;
    EXPECT_NE(s.allocate(kLarge - 1, pool), nullptr);
    Scratch empty;
    EXPECT_NE(empty.allocate(0, pool), nullptr);
  }
  EXPECT_EQ(pool->keptBytes(), 0u);
  auto none = std::make_shared<ScratchPool>(0);  // RDMACC_SCRATCH_CACHE_BYTES=0
  {
    Scratch s;
    s.allocate(kLarge, none);
  }
  EXPECT_EQ(none->keptBytes(), 0u);
}

TEST(Scratch, TheSmallestFittingBufferIsTakenAndLimitsHold) {
  auto pool = std::make_shared<ScratchPool>(10 * kLarge);
  ScratchPool::Buffer big = pool->take(8 * kLarge);
  ScratchPool::Buffer small = pool->take(2 * kLarge);
  const uint8_t* smallData = small.data.get();
  pool->give(std::move(big));
  pool->give(std::move(small));
  EXPECT_EQ(pool->keptBytes(), 10 * kLarge);
  EXPECT_EQ(pool->take(kLarge).data.get(), smallData);
  // Over the byte limit: a larger buffer displaces smaller ones, a smaller
  // one is freed.
  pool->give(pool->take(9 * kLarge));
  EXPECT_EQ(pool->keptBytes(), 9 * kLarge);
  pool->give(pool->take(2 * kLarge));  // takes the 9: gives it back
  EXPECT_EQ(pool->keptBytes(), 9 * kLarge);
  pool->give(ScratchPool::Buffer{std::make_unique<uint8_t[]>(2 * kLarge), 2 * kLarge});
  EXPECT_EQ(pool->keptBytes(), 9 * kLarge);
  // At most kMaxKept buffers.
  auto many = std::make_shared<ScratchPool>(size_t{1} << 40);
  for (size_t i = 0; i < ScratchPool::kMaxKept + 3; ++i) {
    many->give(ScratchPool::Buffer{std::make_unique<uint8_t[]>(kLarge), kLarge});
  }
  EXPECT_EQ(many->keptBytes(), ScratchPool::kMaxKept * kLarge);
}

TEST(Scratch, MovingHandsTheBufferOver) {
  auto pool = std::make_shared<ScratchPool>(size_t{1} << 30);
  Scratch a;
  uint8_t* data = a.allocate(kLarge, pool);
  Scratch b = std::move(a);
  EXPECT_EQ(b.data(), data);
  EXPECT_EQ(a.size(), 0u);  // NOLINT(bugprone-use-after-move): moved-from is empty
  b = Scratch{};
  EXPECT_EQ(pool->keptBytes(), kLarge);
}

}  // namespace
}  // namespace rdmacc
