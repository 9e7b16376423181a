#include "src/core/owned_mutex.hpp"

#include <mutex>
#include <thread>

#include <gtest/gtest.h>

namespace rdmacc {
namespace {

TEST(OwnedMutex, ItsOwnerTriesAndFailsInsteadOfUndefinedBehaviour) {
  OwnedMutex m;
  EXPECT_FALSE(m.heldByThisThread());
  std::unique_lock lock(m);
  EXPECT_TRUE(m.heldByThisThread());
  EXPECT_FALSE(m.try_lock());  // a Work callback under the progress lock
  EXPECT_TRUE(m.heldByThisThread());
  lock.unlock();
  EXPECT_FALSE(m.heldByThisThread());
  EXPECT_TRUE(m.try_lock());
  m.unlock();
}

TEST(OwnedMutex, AnotherThreadSeesItHeldButNotByItself) {
  OwnedMutex m;
  std::unique_lock lock(m);
  bool held = true, got = true;
  std::thread([&] {
    held = m.heldByThisThread();
    got = m.try_lock();
  }).join();
  EXPECT_FALSE(held);
  EXPECT_FALSE(got);
  lock.unlock();
  std::thread([&] {
    got = m.try_lock();
    held = m.heldByThisThread();
    if (got) m.unlock();
  }).join();
  EXPECT_TRUE(got);
  EXPECT_TRUE(held);
  EXPECT_FALSE(m.heldByThisThread());
}

}  // namespace
}  // namespace rdmacc
