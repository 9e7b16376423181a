#include "src/core/ring.hpp"

#include <gtest/gtest.h>

#include <deque>
#include <random>

namespace rdmacc {
namespace {

TEST(Ring, BehavesAsAFifoThroughWrapAndGrowth) {
  Ring<int> ring;
  std::deque<int> model;
  std::mt19937 random(7);
  int next = 0;
  for (int i = 0; i < 20000; ++i) {
    if (model.empty() || random() % 3 != 0) {
      ring.push_back(next);
      model.push_back(next++);
    } else {
      ASSERT_EQ(ring.front(), model.front());
      ring.pop_front();
      model.pop_front();
    }
    ASSERT_EQ(ring.size(), model.size());
    if (!model.empty()) {
      ASSERT_EQ(ring.front(), model.front());
      ASSERT_EQ(ring[model.size() - 1], model.back());
    }
  }
}

TEST(Ring, AReservedRingCyclesWithoutGrowing) {
  Ring<int> ring;
  ring.reserve(16);
  const size_t capacity = ring.capacity();
  for (int i = 0; i < 1000; ++i) {
    for (int k = 0; k < 16; ++k) ring.push_back(i * 16 + k);
    for (int k = 0; k < 16; ++k) {
      ASSERT_EQ(ring.front(), i * 16 + k);
      ring.pop_front();
    }
  }
  EXPECT_TRUE(ring.empty());
  EXPECT_EQ(ring.capacity(), capacity);
}

}  // namespace
}  // namespace rdmacc
