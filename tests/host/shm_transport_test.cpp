// The shared-memory transport's setup, without a second process: what is
// left behind when a local peer never arrives, and single-copy writes to an
// address that is not there.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <memory>
#include <string>

#include <fmt/format.h>

#include "rdmacc/backend.hpp"
#include "rdmacc/error.hpp"
#include "rdmacc/store.hpp"
#include "rdmacc/version.hpp"
#include "src/cma.hpp"
#include "src/handshake.hpp"
#include "src/store_util.hpp"

namespace rdmacc {
namespace {

using namespace std::chrono_literals;

size_t ourSegments() {
  size_t n = 0;
  const std::string prefix = "rdmacc-" + std::to_string(::getpid()) + "-";
  for (const auto& entry : std::filesystem::directory_iterator("/dev/shm")) {
    if (entry.path().filename().string().starts_with(prefix)) ++n;
  }
  return n;
}

// Rank 1 announced itself on this host and then never published its segment:
// rank 0's setup fails with a store timeout, and its own segment is unlinked
// (a constructor that throws runs no destructor).
TEST(ShmTransport, APeerThatNeverArrivesLeavesNoSegmentBehind) {
  auto store = std::make_shared<HashStore>(500ms);
  store->set("rdmacc/host/lonely/1",
             toBytes(fmt::format(
                 "rdmacc {} protocol {}\nRDMACC_TRANSPORT=shm RDMACC_IB_RAILS=1\nsame-host",
                 version(), handshake::kVersion)));
  const size_t before = ourSegments();
  try {
    VerbsBackend backend(store, 0, 2,
                         VerbsBackend::Options{.groupName = "lonely",
                                               .config = {{"RDMACC_TRANSPORT", "shm"},
                                                          {"RDMACC_HOST_ID", "same-host"},
                                                          {"RDMACC_STORE_TIMEOUT", "500ms"}}});
    FAIL() << "a group formed without rank 1";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("rdmacc/shm/lonely"), std::string::npos) << e.what();
  }
  EXPECT_EQ(ourSegments(), before);
}

// Single-copy writes go where a peer's advert says; an address the peer does
// not have (a hostile or stale advert) is refused by the kernel, reported,
// and nothing is written: the transport then sends through the slot.
TEST(SingleCopy, WritesWhereAskedAndRefusesAnAddressThatIsNotMapped) {
  std::string why;
  uint64_t target = 0;
  const uint64_t value = 0x1122334455667788;
  ASSERT_TRUE(
      cma::write(::getpid(), &value, reinterpret_cast<uintptr_t>(&target), sizeof value, why))
      << why;
  EXPECT_EQ(target, value);
  uint64_t back = 0;
  ASSERT_TRUE(cma::read(::getpid(), reinterpret_cast<uintptr_t>(&target), &back, sizeof back, why))
      << why;
  EXPECT_EQ(back, value);
  EXPECT_FALSE(cma::write(::getpid(), &value, 16, sizeof value, why));
  EXPECT_NE(why.find("process_vm_writev"), std::string::npos) << why;
  EXPECT_FALSE(cma::read(::getpid(), 16, &back, sizeof back, why));
  EXPECT_NE(why.find("process_vm_readv"), std::string::npos) << why;
}

}  // namespace
}  // namespace rdmacc
