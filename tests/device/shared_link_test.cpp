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
#include "src/schedule/algorithms/algorithms.hpp"
#include "src/schedule/schedule.hpp"
#include "src/transport/link.hpp"
#include "src/transport/rdma/transport.hpp"
#include "src/transport/registration_cache.hpp"
#include "src/transport/wire.hpp"
#include "tests/device/in_process.hpp"
#include "verbs/error.hpp"

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
  auto engine = std::make_unique<Engine>(links[0]->open(kChannel, 0, {0, 1}, &registered),
                                         EngineOptions{.group = "later",
                                                       .rank = 0,
                                                       .size = kLater,
                                                       .registrations = &registered,
                                                       .zeroCopyMinBytes = 4096});
  auto op = std::make_unique<Operation>();
  op->type = OpType::AllgatherBase;
  op->timeout = 3s;
  op->schedule = std::make_shared<Plan>(
      algorithms::ringAllgather(0, kLater, evenBlocks(kBytes, kLater, 1)), Algorithm::Ring);
  op->sendBase = op->recvBase = target.data();
  op->dtype = DataType::UInt8;
  op->checkValue = kBytes;
  auto work = engine->submit(std::move(op));
  // Rank 1 of the later group takes the advert off its channel.
  auto channel1 = links[1]->open(kChannel, 1, {0, 1});
  struct Reader final : TransportSink {
    Transport& transport;
    std::optional<wire::Header> advert;
    explicit Reader(Transport& t) : transport(t) {}
    void arrived(int peer, const Incoming& in) override {
      if (in.header.kind == wire::MessageKind::Advert) advert = in.header;
      transport.release(peer, in.slot);
    }
    void failed(int, Error) override {}
  } reader(*channel1);
  for (auto until = Clock::now() + 20s; !reader.advert && Clock::now() < until;) {
    channel1->poll(reader);
  }
  ASSERT_TRUE(reader.advert) << "rank 0 advertised no direct receive over the shared link";
  const wire::Header advert = *reader.advert;
  const auto begin = reinterpret_cast<uintptr_t>(target.data());
  ASSERT_EQ(advert.addr, begin + kBytes / 2);  // rank 1's block
  EXPECT_THROW(work->wait(), Error);           // over: timed out
  // Rank 2, outside the later group, through its queue pair to rank 0.
  PageBuffer local(4096);
  auto mr =
      verbs::registerMemory(meshes[2]->pd(), local.data(), local.size(), IBV_ACCESS_LOCAL_WRITE);
  ibv_qp* qp = meshes[2]->qp(0);
  std::fill_n(local.data(), 64, uint8_t{0x5a});
  EXPECT_EQ(
      rawTransfer(*meshes[2], qp, IBV_WR_RDMA_WRITE, local.data(), mr->lkey, begin, advert.rkey),
      IBV_WC_SUCCESS);
  EXPECT_EQ(std::count(target.data(), target.data() + 64, uint8_t{0x5a}), 64);
  // Deregistered: refused, and the memory keeps what it had.
  registered.remove(target.data());
  std::fill_n(local.data(), 64, uint8_t{0x77});
  EXPECT_EQ(
      rawTransfer(*meshes[2], qp, IBV_WR_RDMA_WRITE, local.data(), mr->lkey, begin, advert.rkey),
      IBV_WC_REM_ACCESS_ERR);
  EXPECT_EQ(std::count(target.data(), target.data() + 64, uint8_t{0x5a}), 64);
  engine.reset();
  channel1.reset();
  links.clear();
}

}  // namespace
}  // namespace rdmacc
