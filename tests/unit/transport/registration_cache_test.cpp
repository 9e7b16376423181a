#include <gtest/gtest.h>

#include <vector>

#include "rdmacc/error.hpp"
#include "src/transport/registration_cache.hpp"

using namespace rdmacc;

namespace {

// Stands in for ibv_reg_mr so the cache's bookkeeping can be checked without a
// device; the device tests run the real registrar.
struct Device {
  std::vector<std::pair<uintptr_t, size_t>> registered;
  int live = 0;
  RegistrationCache::Registrar registrar() {
    return [this](uintptr_t begin, size_t length) {
      registered.emplace_back(begin, length);
      ++live;
      return Registration{.begin = begin,
                          .end = begin + length,
                          .lkey = static_cast<uint32_t>(registered.size()),
                          .owner = std::shared_ptr<void>(nullptr, [this](void*) { --live; })};
    };
  }
};

const void* at(uintptr_t a) {
  return reinterpret_cast<const void*>(a);
}

}  // namespace

TEST(RegistrationCache, RegistersWholePagesAndFindsCoveredRanges) {
  Device d;
  RegistrationCache cache(d.registrar(), true, 4096);
  cache.add(at(0x10010), 0x2000);  // pages 0x10000..0x13000
  ASSERT_EQ(d.registered.size(), 1u);
  EXPECT_EQ(d.registered[0], std::make_pair(uintptr_t{0x10000}, size_t{0x3000}));
  EXPECT_NE(cache.find(at(0x10010), 0x2000), nullptr);
  EXPECT_NE(cache.find(at(0x11000), 0x100), nullptr);
  EXPECT_NE(cache.find(at(0x12f00), 0x100), nullptr);  // inside the last page
  EXPECT_EQ(cache.find(at(0x12f00), 0x101), nullptr);  // past it
  EXPECT_EQ(cache.find(at(0x0fff0), 0x20), nullptr);   // before the registered pointer
  EXPECT_EQ(cache.find(at(0x20000), 0x10), nullptr);
}

TEST(RegistrationCache, TransfersKeepTheRegionAliveAfterRemove) {
  Device d;
  RegistrationCache cache(d.registrar(), true, 4096);
  cache.add(at(0x40000), 0x1000);
  auto inFlight = cache.find(at(0x40000), 0x1000);
  cache.remove(at(0x40000));
  EXPECT_EQ(cache.entries(), 0u);
  EXPECT_EQ(cache.find(at(0x40000), 0x1000), nullptr);  // new transfers copy
  EXPECT_EQ(d.live, 1);                                 // the write in flight still reads it
  inFlight.reset();
  EXPECT_EQ(d.live, 0);
}

TEST(RegistrationCache, AddsCountAndGrowingReplacesTheRegion) {
  Device d;
  RegistrationCache cache(d.registrar(), true, 4096);
  cache.add(at(0x80000), 0x1000);
  cache.add(at(0x80000), 0x800);  // already covered: counted, not registered again
  EXPECT_EQ(d.registered.size(), 1u);
  cache.add(at(0x80000), 0x3000);  // grown
  EXPECT_EQ(d.registered.size(), 2u);
  EXPECT_EQ(d.live, 1);  // the smaller region went with nothing holding it
  EXPECT_NE(cache.find(at(0x82000), 0x1000), nullptr);
  cache.remove(at(0x80000));
  cache.remove(at(0x80000));
  EXPECT_NE(cache.find(at(0x80000), 8), nullptr);
  cache.remove(at(0x80000));
  EXPECT_EQ(cache.find(at(0x80000), 8), nullptr);
  EXPECT_EQ(d.live, 0);
  EXPECT_THROW(cache.remove(at(0x80000)), Error);
}

TEST(RegistrationCache, FindsAmongManyAndAcrossNeighbours) {
  Device d;
  RegistrationCache cache(d.registrar(), true, 4096);
  for (uintptr_t i = 0; i < 100; ++i) cache.add(at(0x1000000 + i * 0x10000), 0x8000);
  cache.add(at(0x3000000), 0x100000);  // one long region among short ones
  for (uintptr_t i = 0; i < 100; ++i) {
    auto r = cache.find(at(0x1000000 + i * 0x10000 + 0x100), 0x7000);
    ASSERT_NE(r, nullptr) << i;
    EXPECT_EQ(r->begin, 0x1000000 + i * 0x10000);
    EXPECT_EQ(cache.find(at(0x1000000 + i * 0x10000 + 0x8000), 8), nullptr) << i;  // the gap
  }
  EXPECT_NE(cache.find(at(0x30ff000), 0x1000), nullptr);
}

TEST(RegistrationCache, DisabledFindsNothingButStillChecksArguments) {
  Device d;
  RegistrationCache cache(d.registrar(), false, 4096);
  cache.add(at(0x10000), 0x1000);
  EXPECT_EQ(d.registered.size(), 0u);
  EXPECT_EQ(cache.find(at(0x10000), 8), nullptr);
  cache.remove(at(0x10000));
  EXPECT_THROW(cache.add(nullptr, 8), Error);
  EXPECT_THROW(cache.add(at(0x10000), 0), Error);
}
