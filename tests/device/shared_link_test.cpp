// InProcess.* device tests of connections groups share (docs/decisions/019,
// RDMACC_SHARE_CONNECTIONS=1): what docs/security.md promises there, checked
// on a real verbs device.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <optional>
#include <vector>

#include "rdmacc/error.hpp"
#include "rdmacc/store.hpp"
#include "src/core/buffer.hpp"
#include "src/engine/engine.hpp"
#include "src/transport/link.hpp"
#include "src/transport/rdma/transport.hpp"
#include "src/transport/registration_cache.hpp"
#include "src/transport/wire.hpp"
#include "tests/device/in_process.hpp"

namespace rdmacc {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

// docs/security.md, "Memory the user registered", over shared connections:
// a later group registers in the founding group's protection domain, so the
// rkey of its advert opens the registration to every rank of the founding
// group, not only to the later group's. Ranks 0, 1 and 2 found a link; the
// group {0, 1} runs over channel 1 and rank 0 advertises a direct receive in
// registered memory to rank 1; rank 2, outside that group, writes with the
// advert's rkey through its own queue pair to rank 0: the bytes land, until
// rank 0 deregisters the memory.
TEST(InProcess, OverASharedLinkAnAdvertsRkeyOpensTheRegistrationToTheFoundingGroup) {
  HashStore store(20s);
  constexpr int kFounders = 3;
  constexpr int kLater = 2;
  constexpr size_t kBytes = 64 << 10;
  auto [meshes, transports, errors] = formInProcess(store, "founding", kFounders, quickConfig(),
                                                    TransportOptions{.slotsPerPeer = 4});
  for (const auto& e : errors) ASSERT_EQ(e, "");
  std::vector<std::shared_ptr<Link>> links;
  for (int r = 0; r < kFounders; ++r) {
    links.push_back(std::make_shared<Link>(std::move(transports[static_cast<size_t>(r)]), r,
                                           kFounders, 1 << 20));
  }
  constexpr uint32_t kChannel = 1;
  // Rank 0 of the later group: its registrations, made as the backend makes
  // them over a link (in the link's protection domain), and an engine.
  RegistrationCache registered(userMemoryRegistrar(meshes[0]->pd()), true, /*pageBytes=*/1);
  PageBuffer target(kBytes);
  std::fill_n(target.data(), kBytes, uint8_t{0x11});
  registered.add(target.data(), kBytes);
  auto engine = std::make_unique<Engine>(links[0]->open(kChannel, 0, {0, 1}),
                                         EngineOptions{.group = "later",
                                                       .rank = 0,
                                                       .size = kLater,
                                                       .registrations = &registered,
                                                       .zeroCopyMinBytes = 4096});
  auto work = advertisingAllgather(*engine, target.data(), kBytes, kLater);
  // Rank 1 of the later group takes the advert off its channel.
  auto channel1 = links[1]->open(kChannel, 1, {0, 1});
  const std::optional<wire::Header> advert = takeAdvert(*channel1);
  ASSERT_TRUE(advert) << "rank 0 advertised no direct receive over the shared link";
  ASSERT_EQ(advert->addr, reinterpret_cast<uintptr_t>(target.data()) + kBytes / 2);  // rank 1's
  EXPECT_THROW(work->wait(), Error);  // over: timed out
  // Rank 2, outside the later group, through its queue pair to rank 0.
  expectRkeyOpensUntilDeregistered(*meshes[2], meshes[2]->qp(0), registered, target.data(),
                                   advert->rkey);
  engine.reset();
  channel1.reset();
  links.clear();
}

}  // namespace
}  // namespace rdmacc
