// Which ranks share a host, and what a rank learns of its peers' builds
// before any connection: the versions and the transport choice each rank
// publishes through the store (hostile input: checked, and quoted bounded).
#include <gtest/gtest.h>

#include <fmt/format.h>

#include "rdmacc/error.hpp"
#include "rdmacc/store.hpp"
#include "rdmacc/version.hpp"
#include "src/bootstrap/host_identity.hpp"
#include "src/store/store_util.hpp"
#include "src/transport/rdma/handshake.hpp"

namespace rdmacc {
namespace {

// What rank 1 of group "g" published, as another build would.
std::string hostNumbersError(const std::string& published, const std::string& agreed = "auto") {
  HashStore store;
  store.set("rdmacc/host/g/1", toBytes(published));
  try {
    hostNumbers(store, {}, "g", 0, 2, "host-a", agreed, {"-"});
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

std::string mine() {
  return fmt::format("rdmacc {} protocol {}", version(), handshake::kVersion);
}

TEST(HostIdentity, RanksWithTheSameIdentityShareAHost) {
  HashStore store;
  store.set("rdmacc/host/g/1", toBytes(mine() + "\nauto\n/rdmacc-1-0:1\nhost-a"));
  store.set("rdmacc/host/g/2", toBytes(mine() + "\nauto\n/rdmacc-2-0:2\nhost-b"));
  EXPECT_EQ(hostNumbers(store, {}, "g", 0, 3, "host-a", "auto", {"-"}),
            (std::vector<int>{0, 0, 1}));
}

// Every rank numbers the hosts alike (by their lowest rank), whichever it is.
TEST(HostIdentity, HostsAreNumberedByTheirLowestRank) {
  HashStore store;
  for (int r : {0, 2, 3}) {
    store.set(fmt::format("rdmacc/host/g/{}", r),
              toBytes(mine() + "\nauto\n/rdmacc-3-0:3\n" + (r == 3 ? "host-c" : "host-b")));
  }
  EXPECT_EQ(hostNumbers(store, {}, "g", 1, 4, "host-a", "auto", {"-"}),
            (std::vector<int>{0, 1, 0, 2}));
}

TEST(HostIdentity, AnotherProtocolIsRefusedNamingBothVersions) {
  const std::string error = hostNumbersError("rdmacc 9.1.0 protocol 77\nauto\nhost-a");
  EXPECT_NE(error.find("rank 1 runs rdmacc 9.1.0 protocol 77, this rank " + mine()),
            std::string::npos)
      << error;
  EXPECT_NE(error.find("install the same rdmacc on every node"), std::string::npos) << error;
}

TEST(HostIdentity, ABuildThatStatesNoVersionIsRefused) {
  // What rdmacc 0.1.0 before this change published: "<transport>\n<identity>".
  const std::string error = hostNumbersError("auto\nhost-a");
  EXPECT_NE(error.find("rank 1 runs an rdmacc that does not state its version (it wrote 'auto')"),
            std::string::npos)
      << error;
}

TEST(HostIdentity, AnotherReleaseWithTheSameProtocolIsAccepted) {
  HashStore store;
  store.set("rdmacc/host/g/1",
            toBytes(fmt::format("rdmacc 0.0.9 protocol {}\nauto\n/rdmacc-1-0:1\nhost-a",
                                handshake::kVersion)));
  EXPECT_EQ(hostNumbers(store, {}, "g", 0, 2, "host-a", "auto", {"-"}), (std::vector<int>{0, 0}));
}

TEST(HostIdentity, HostileTextIsQuotedBounded) {
  const std::string error = hostNumbersError(std::string(100000, 'x'));
  EXPECT_LT(error.size(), 600u) << error.substr(0, 200);
  EXPECT_NE(error.find("does not state its version"), std::string::npos);
}

TEST(HostIdentity, ADifferentTransportChoiceIsRefused) {
  const std::string error = hostNumbersError(mine() + "\nrdma\nhost-a");
  EXPECT_NE(error.find("rank 1 runs with rdma, this rank with auto"), std::string::npos) << error;
}

// What the backend publishes: a rank striping over another number of NICs
// is refused by name before any connection is waited for.
TEST(HostIdentity, ADifferentRailCountIsRefused) {
  const std::string error =
      hostNumbersError(mine() + "\nRDMACC_TRANSPORT=auto RDMACC_IB_RAILS=2\nhost-a",
                       "RDMACC_TRANSPORT=auto RDMACC_IB_RAILS=1");
  EXPECT_NE(error.find("rank 1 runs with RDMACC_TRANSPORT=auto RDMACC_IB_RAILS=2, this rank with "
                       "RDMACC_TRANSPORT=auto RDMACC_IB_RAILS=1"),
            std::string::npos)
      << error;
}

// The carried lines travel with the identity: every rank's, by rank; a
// record with fewer (another build) is refused naming the rank.
TEST(HostIdentity, SharedMemoryRecordsComeBackByRank) {
  HashStore store;
  store.set("rdmacc/host/g/1", toBytes(mine() + "\nauto\n/rdmacc-7-ab:7\nhost-a"));
  std::vector<std::vector<std::string>> carried;
  EXPECT_EQ(hostNumbers(store, {}, "g", 0, 2, "host-a", "auto", {"/rdmacc-5-cd:5"}, &carried),
            (std::vector<int>{0, 0}));
  EXPECT_EQ(carried,
            (std::vector<std::vector<std::string>>{{"/rdmacc-5-cd:5"}, {"/rdmacc-7-ab:7"}}));
  // Two lines carried (shared memory, RDMA): a record with one is refused.
  store.set("rdmacc/host/g/1", toBytes(mine() + "\nauto\n/rdmacc-7-ab:7\n"));
  try {
    hostNumbers(store, {}, "g", 0, 2, "host-a", "auto", {"/rdmacc-5-cd:5", "-"}, &carried);
    FAIL() << "a record with one carried line of two was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("rank 1 published a host record with 1 of its 2 carried "
                                         "lines"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace rdmacc
