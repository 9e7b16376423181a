// Device tests: need a real verbs device (run them in the rxe VM when the host
// has none: tools/with-rdma-device). Two kinds:
//   MultiRank.*  run under `rdmacc-run -n N` (one process per rank);
//   InProcess.*  run as one process, ranks as threads sharing a HashStore.
#include <gtest/gtest.h>

#include <arpa/inet.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <functional>
#include <optional>
#include <set>
#include <thread>

#include <fmt/format.h>

#include "rdmacc/config.hpp"
#include "rdmacc/environment.hpp"
#include "rdmacc/error.hpp"
#include "rdmacc/log.hpp"
#include "rdmacc/topology.hpp"
#include "src/core/buffer.hpp"
#include "src/engine/engine.hpp"
#include "src/schedule/algorithms/algorithms.hpp"
#include "src/schedule/schedule.hpp"
#include "src/transport/rdma/mesh.hpp"
#include "src/transport/rdma/transport.hpp"
#include "src/transport/rdma/wr_id.hpp"
#include "src/transport/wire.hpp"
#include "tests/device/in_process.hpp"
#include "verbs/error.hpp"

namespace rdmacc {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

std::optional<GroupEnvironment> gGroup;

constexpr size_t kSlotBytes = 4099;  // odd on purpose: no alignment luck

uint8_t pattern(int src, int dst, int qp, size_t i) {
  return static_cast<uint8_t>((i * 31 + static_cast<size_t>(src) * 7 +
                               static_cast<size_t>(dst) * 13 + static_cast<size_t>(qp) * 101 + 5) &
                              0xff);
}

void storeBarrier(Store& store, const std::string& name, int size) {
  store.add(name, 1);
  auto deadline = Clock::now() + 60s;
  while (std::stoll(toString(store.get(name))) < size) {
    ASSERT_LT(Clock::now(), deadline) << "barrier " << name << " timed out";
    std::this_thread::sleep_for(5ms);
  }
}

// Every rank writes a distinct pattern into its own slot at every peer, on every
// QP, with WRITE_WITH_IMM carrying (source, qp); every rank then checks that it
// got exactly one immediate per (peer, qp) and that every byte is right.
void exchangeAllPairs(Mesh& mesh, Store& store, const std::string& tag) {
  const int rank = mesh.rank(), size = mesh.size(), qps = mesh.qpsPerPeer();
  const size_t slots = static_cast<size_t>(size * qps);
  PageBuffer source(slots * kSlotBytes), target(slots * kSlotBytes);
  auto sourceMr =
      verbs::registerMemory(mesh.pd(), source.data(), source.size(), verbs::kRemoteWriteAccess);
  auto targetMr =
      verbs::registerMemory(mesh.pd(), target.data(), target.size(), verbs::kRemoteWriteAccess);
  store.set(
      fmt::format("{}/mr/{}", tag, rank),
      toBytes(fmt::format("{}:{}", reinterpret_cast<uintptr_t>(target.data()), targetMr->rkey)));

  int posted = 0;
  for (int peer = 0; peer < size; ++peer) {
    if (peer == rank) continue;
    std::string mr = toString(store.get(fmt::format("{}/mr/{}", tag, peer)));
    uint64_t addr = std::stoull(mr.substr(0, mr.find(':')));
    auto rkey = static_cast<uint32_t>(std::stoul(mr.substr(mr.find(':') + 1)));
    for (int q = 0; q < qps; ++q) {
      size_t slot = static_cast<size_t>(rank * qps + q);
      uint8_t* src = source.data() + static_cast<size_t>(peer * qps + q) * kSlotBytes;
      for (size_t i = 0; i < kSlotBytes; ++i) src[i] = pattern(rank, peer, q, i);
      verbs::WriteRequest w{.wrId = pack(WrId{WrKind::WriteImm, static_cast<uint8_t>(q),
                                              static_cast<uint16_t>(peer), 0}),
                            .local = src,
                            .lkey = sourceMr->lkey,
                            .length = static_cast<uint32_t>(kSlotBytes),
                            .remoteAddr = addr + slot * kSlotBytes,
                            .rkey = rkey,
                            .imm = static_cast<uint32_t>(rank << 8 | q)};
      ASSERT_EQ(verbs::postWrite(mesh.qp(peer, q), w), 0);
      ++posted;
    }
  }
  int sends = 0;
  std::set<uint32_t> imms;
  const int expected = (size - 1) * qps;
  auto deadline = Clock::now() + 60s;
  while (sends < posted || static_cast<int>(imms.size()) < expected) {
    std::array<ibv_wc, 16> wcs;
    int n = mesh.cq().poll(wcs);
    for (int i = 0; i < n; ++i) {
      const ibv_wc& wc = wcs[static_cast<size_t>(i)];
      WrId id = unpack(wc.wr_id);
      ASSERT_EQ(wc.status, IBV_WC_SUCCESS)
          << verbs::completionError(wc, id.peer, "", "test write").what();
      if (id.kind == WrKind::Recv) {
        ASSERT_EQ(wc.opcode, IBV_WC_RECV_RDMA_WITH_IMM);
        uint32_t imm = ntohl(wc.imm_data);
        EXPECT_EQ(static_cast<int>(imm >> 8), id.peer) << "immediate from the wrong QP";
        EXPECT_TRUE(imms.insert(imm).second) << "duplicate immediate " << imm;
      } else {
        ++sends;
      }
    }
    ASSERT_LT(Clock::now(), deadline) << fmt::format("rank {}: {} of {} sends, {} of {} immediates",
                                                     rank, sends, posted, imms.size(), expected);
  }
  for (int peer = 0; peer < size; ++peer) {
    if (peer == rank) continue;
    for (int q = 0; q < qps; ++q) {
      EXPECT_TRUE(imms.contains(static_cast<uint32_t>(peer << 8 | q)))
          << "no immediate from " << peer << "/" << q;
      const uint8_t* got = target.data() + static_cast<size_t>(peer * qps + q) * kSlotBytes;
      size_t bad = 0;
      for (size_t i = 0; i < kSlotBytes; ++i) bad += got[i] != pattern(peer, rank, q, i);
      EXPECT_EQ(bad, 0u) << "rank " << rank << ": bytes from rank " << peer << " qp " << q
                         << " corrupted";
    }
  }
  // Nobody tears down QPs while a peer may still be writing.
  storeBarrier(store, tag + "/done", size);
}

void expectRoceV2Ipv4Gid(const Mesh& mesh) {
  const Endpoint& ep = mesh.endpoint();
  EXPECT_EQ(ep.gidType, "RoCE v2");
  EXPECT_TRUE(ep.gid.starts_with("::ffff:")) << ep.gid;
  EXPECT_EQ(ep.gid, "::ffff:" + ep.ipv4);
  if (const char* want = std::getenv("RXE_GID_INDEX")) {
    EXPECT_EQ(ep.gidIndex, std::atoi(want));
  }
  // The QPs really use it.
  for (int peer = 0; peer < mesh.size(); ++peer) {
    if (peer == mesh.rank()) continue;
    ibv_qp_attr attr{};
    ibv_qp_init_attr init{};
    ASSERT_EQ(ibv_query_qp(mesh.qp(peer), &attr, IBV_QP_AV | IBV_QP_STATE | IBV_QP_PATH_MTU, &init),
              0);
    EXPECT_EQ(attr.qp_state, IBV_QPS_RTS);
    EXPECT_EQ(attr.ah_attr.grh.sgid_index, ep.gidIndex);
  }
}

// ------------------------------------------------------------ multi-rank --

TEST(MultiRank, MeshFormsAndEveryPairExchangesWriteWithImm) {
  ASSERT_TRUE(gGroup) << "run under rdmacc-run";
  Config config = Config::load();
  Mesh mesh(*gGroup->store, gGroup->rank, gGroup->size, config, MeshOptions{.group = "mesh-test"});
  EXPECT_EQ(mesh.qpsPerPeer(), config.getInt("RDMACC_QPS_PER_PEER"));
  expectRoceV2Ipv4Gid(mesh);
  for (int peer = 0; peer < mesh.size(); ++peer) {
    if (peer != mesh.rank()) {
      EXPECT_EQ(mesh.pathMtu(peer), mesh.endpoint().activeMtu);
    }
  }
  exchangeAllPairs(mesh, *gGroup->store, "mesh-test/x1");
  exchangeAllPairs(mesh, *gGroup->store, "mesh-test/x2");  // QPs and receives stay usable
}

// ------------------------------------------------------------ in-process --

// How one rank's attempt to form a group went.
struct Attempt {
  std::string error;  // "formed without rank 2" if it formed
  ErrorKind kind = ErrorKind::Internal;
  int blamed = -1;  // the error's peer rank
  Clock::duration took{};
};

// Ranks 0 and 1 of a group of 3 try to form it in threads of this process;
// rank 2 never comes.
std::array<Attempt, 2> formWithoutRank2(HashStore& store, const std::string& group,
                                        const std::function<Config(int rank)>& configOf) {
  std::array<Attempt, 2> attempts;
  std::vector<std::thread> ranks;
  for (int r = 0; r < 2; ++r) {
    ranks.emplace_back([&, r] {
      Attempt& a = attempts[static_cast<size_t>(r)];
      Config config = configOf(r);
      auto start = Clock::now();
      try {
        Mesh mesh(store, r, 3, config, MeshOptions{.group = group});
        a.error = "formed without rank 2";
      } catch (const Error& e) {
        a.error = e.what();
        a.kind = e.kind();
        a.blamed = e.peerRank();
      }
      a.took = Clock::now() - start;
    });
  }
  for (auto& t : ranks) t.join();
  return attempts;
}

TEST(InProcess, MissingRankIsNamedAfterTheTimeout) {
  HashStore store(10s);
  auto attempts = formWithoutRank2(store, "missing", [](int) { return quickConfig(); });
  for (const Attempt& a : attempts) {
    EXPECT_EQ(a.kind, ErrorKind::Timeout) << a.error;
    EXPECT_EQ(a.blamed, 2) << a.error;
    EXPECT_NE(a.error.find("rank(s) 2 never arrived"), std::string::npos) << a.error;
    EXPECT_LT(a.took, 20s);
    EXPECT_GE(a.took, 3s);
  }
}

// Rank 0 gives up first (shorter timeout) and disconnects from rank 1: rank 1
// names the rank that never came, as rank 0 does, not rank 0's departure.
TEST(InProcess, PeerGivingUpOnAMissingRankIsNotBlamed) {
  HashStore store(20s);
  auto attempts = formWithoutRank2(store, "gives-up", [](int r) {
    return quickConfig({{"RDMACC_CONNECT_TIMEOUT", r == 0 ? "2s" : "15s"}});
  });
  for (const Attempt& a : attempts) {
    EXPECT_EQ(a.kind, ErrorKind::Timeout) << a.error;
    EXPECT_NE(a.error.find("rank(s) 2 never arrived"), std::string::npos) << a.error;
    EXPECT_EQ(a.blamed, 2);
  }
  EXPECT_NE(attempts[1].error.find("rank 0 gave up"), std::string::npos) << attempts[1].error;
  EXPECT_LT(attempts[1].took, 10s) << "rank 1 waited for its own timeout";
}

TEST(InProcess, StrangerWithWrongTokenIsRejectedAndTheGroupStillForms) {
  HashStore store(20s);
  Config config = quickConfig({{"RDMACC_CONNECT_TIMEOUT", "20s"}});
  std::string rank0Error, rank1Error;
  std::optional<Endpoint> formed;
  std::thread rank0([&] {
    try {
      Mesh mesh(store, 0, 2, config, MeshOptions{.group = "stranger"});
      formed = mesh.endpoint();
      storeBarrier(store, "stranger-done", 2);
    } catch (const std::exception& e) {
      rank0Error = e.what();
    }
  });
  // The stranger belongs to another job (its own store, its own token) but
  // knows rank 0's address.
  std::string addr0 = toString(store.get("rdmacc/mesh/stranger/addr/0"));
  HashStore otherJob(5s);
  otherJob.set("rdmacc/mesh/stranger/token", toBytes("12345"));
  otherJob.set("rdmacc/mesh/stranger/addr/0", toBytes(addr0));
  try {
    Mesh stranger(otherJob, 1, 2, quickConfig(), MeshOptions{.group = "stranger"});
    ADD_FAILURE() << "the stranger was accepted";
  } catch (const Error& e) {
    std::string w = e.what();
    EXPECT_NE(w.find("rank 0 rejected our connection: wrong group token"), std::string::npos) << w;
  }
  std::thread rank1([&] {
    try {
      Mesh mesh(store, 1, 2, config, MeshOptions{.group = "stranger"});
      storeBarrier(store, "stranger-done", 2);
    } catch (const std::exception& e) {
      rank1Error = e.what();
    }
  });
  rank0.join();
  rank1.join();
  EXPECT_EQ(rank0Error, "");
  EXPECT_EQ(rank1Error, "");
  EXPECT_TRUE(formed);
}

// After the group formed, a connection request (a late retry, or a stranger
// that learned the token) is rejected and its id destroyed: the sender learns
// why at once, and the formed group neither leaks the id nor sees a peer go.
TEST(InProcess, LateConnectionAfterFormationIsRejectedOnBothSides) {
  HashStore store(20s);
  Config config = quickConfig({{"RDMACC_CONNECT_TIMEOUT", "20s"}});
  std::atomic<bool> strangerDone{false};
  std::string rank0Error, rank1Error;
  std::vector<int> gone;
  std::thread rank0([&] {
    try {
      Mesh mesh(store, 0, 2, config, MeshOptions{.group = "late"});
      storeBarrier(store, "late-formed", 2);
      // What the engine does: poll the connection events.
      while (!strangerDone) {
        for (int peer : mesh.takeDisconnectedPeers()) gone.push_back(peer);
        std::this_thread::sleep_for(10ms);
      }
      for (int peer : mesh.takeDisconnectedPeers()) gone.push_back(peer);
      storeBarrier(store, "late-done", 2);
    } catch (const std::exception& e) {
      rank0Error = e.what();
    }
  });
  std::thread rank1([&] {
    try {
      Mesh mesh(store, 1, 2, config, MeshOptions{.group = "late"});
      storeBarrier(store, "late-formed", 2);
      storeBarrier(store, "late-done", 2);
    } catch (const std::exception& e) {
      rank1Error = e.what();
    }
  });
  while (std::stoll(toString(store.get("late-formed"))) < 2) std::this_thread::sleep_for(5ms);
  // The stranger holds the group's own token and claims rank 1.
  HashStore copy(5s);
  copy.set("rdmacc/mesh/late/token", store.get("rdmacc/mesh/late/token"));
  copy.set("rdmacc/mesh/late/addr/0", store.get("rdmacc/mesh/late/addr/0"));
  auto start = std::chrono::steady_clock::now();
  try {
    Mesh stranger(copy, 1, 2, quickConfig({{"RDMACC_CONNECT_TIMEOUT", "15s"}}),
                  MeshOptions{.group = "late"});
    ADD_FAILURE() << "a connection after formation was accepted";
  } catch (const Error& e) {
    std::string w = e.what();
    EXPECT_NE(w.find("the group has already formed"), std::string::npos) << w;
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, 10s) << "the late sender hung";
  strangerDone = true;
  rank0.join();
  rank1.join();
  EXPECT_EQ(rank0Error, "");
  EXPECT_EQ(rank1Error, "");
  EXPECT_TRUE(gone.empty()) << "rank 0 saw rank " << gone.front() << " leave";
}

// What a peer can reach of our memory (docs/security.md): its own slots
// and one-shot board entries, by writing. A READ of them fails (nothing is
// registered for remote reads), a write into another peer's slots or board
// entries with its own rkey fails (one registration and rkey per peer),
// and so does a write with the other peer's rkey, which its hellos carry,
// through the attacker's own queue pair (a memory window bound to the other
// peer's queue pair; with one protection domain and no windows that rkey is
// good on every queue pair and the write lands, as it does with
// RDMACC_MEMORY_WINDOWS=0: the second case): the NIC checks, whatever the
// peer's code does.
void peerAccessCase(bool windows) {
  HashStore store(20s);
  constexpr int kSize = 4;
  constexpr int kSlots = 4;
  constexpr size_t kSlotBytes4k = 4096;
  auto [meshes, transports, errors] = formInProcess(
      store, "exposed", kSize, quickConfig({{"RDMACC_MEMORY_WINDOWS", windows ? "1" : "0"}}),
      TransportOptions{.slotsPerPeer = kSlots, .slotBytes = kSlotBytes4k});
  for (const auto& e : errors) ASSERT_EQ(e, "");
  for (const auto& m : meshes) {
    ASSERT_EQ(m->windows(), windows) << "the device binds no type-2 memory windows";
  }
  // Rank `owner`'s slots for rank `peer`, as its hellos gave them to `peer`
  // (and so as any rank that saw them could name them); its board entries
  // for `peer` follow the slots.
  auto slotsAt = [&](int owner, int peer) {
    const std::vector<SlotAdvert> lanes = meshes[static_cast<size_t>(peer)]->remoteSlots(owner);
    EXPECT_EQ(lanes.size(), 1u);
    EXPECT_EQ(lanes.at(0).slots, kSlots);
    return lanes.at(0);
  };
  auto boardAt = [&](int owner, int peer) {
    const SlotAdvert slots = slotsAt(owner, peer);
    EXPECT_GT(slots.boardBytes, 0) << "rank " << owner << " offered no one-shot board";
    return slots.base + kSlots * kSlotBytes4k;
  };
  PageBuffer local(4096);
  // Each attempt that fails breaks the attacker's queue pair: rank 1 tries
  // the slots, rank 2 the board, rank 3 other peers' rkeys.
  Mesh* attackerMesh = meshes[1].get();
  std::vector<verbs::MrPtr> mrs;
  for (int r : {1, 2, 3}) {
    mrs.push_back(verbs::registerMemory(meshes[static_cast<size_t>(r)]->pd(), local.data(),
                                        local.size(), IBV_ACCESS_LOCAL_WRITE));
  }
  const verbs::MrPtr* mr = &mrs[0];
  auto attempt = [&](ibv_qp* qp, ibv_wr_opcode opcode, uint64_t remote, uint32_t rkey) {
    return rawTransfer(*attackerMesh, qp, opcode, local.data(), (*mr)->lkey, remote, rkey);
  };
  // Rank 0's slots for rank 1: writable, not readable.
  const SlotAdvert own0 = slotsAt(0, 1);
  EXPECT_EQ(attempt(attackerMesh->qp(0), IBV_WR_RDMA_WRITE, own0.base, own0.rkey), IBV_WC_SUCCESS);
  // Refused by the peer's queue pair (no remote read access: rxe says
  // "invalid request") or by its memory region (access error).
  const auto read = attempt(attackerMesh->qp(0), IBV_WR_RDMA_READ, own0.base, own0.rkey);
  EXPECT_TRUE(read == IBV_WC_REM_INV_REQ_ERR || read == IBV_WC_REM_ACCESS_ERR)
      << ibv_wc_status_str(read);
  // At rank 2, rank 1's rkey opens its own slots, not rank 0's.
  const SlotAdvert own2 = slotsAt(2, 1);
  EXPECT_EQ(attempt(attackerMesh->qp(2), IBV_WR_RDMA_WRITE, own2.base, own2.rkey), IBV_WC_SUCCESS);
  EXPECT_EQ(attempt(attackerMesh->qp(2), IBV_WR_RDMA_WRITE, slotsAt(2, 0).base, own2.rkey),
            IBV_WC_REM_ACCESS_ERR);
  // The one-shot board the same: rank 2's rkey at rank 0 opens rank 2's
  // entries, not rank 1's.
  attackerMesh = meshes[2].get();
  mr = &mrs[1];
  const uint32_t rkey2at0 = slotsAt(0, 2).rkey;
  EXPECT_EQ(attempt(attackerMesh->qp(0), IBV_WR_RDMA_WRITE, boardAt(0, 2), rkey2at0),
            IBV_WC_SUCCESS);
  EXPECT_EQ(attempt(attackerMesh->qp(0), IBV_WR_RDMA_WRITE, boardAt(0, 1), rkey2at0),
            IBV_WC_REM_ACCESS_ERR);
  // Rank 3 with the rkeys rank 1 and rank 2 gave rank 0, through its own
  // queue pairs: rank 1's slots for rank 0, rank 2's board entries for
  // rank 0. Refused; the victims' memory keeps none of rank 3's bytes.
  // Without windows both land.
  const ibv_wc_status expected = windows ? IBV_WC_REM_ACCESS_ERR : IBV_WC_SUCCESS;
  attackerMesh = meshes[3].get();
  mr = &mrs[2];
  std::fill_n(local.data(), 64, uint8_t{0xa5});
  const SlotAdvert victim1 = slotsAt(1, 0);
  EXPECT_EQ(attempt(attackerMesh->qp(1), IBV_WR_RDMA_WRITE, victim1.base, victim1.rkey), expected);
  const uint8_t* slotAtRank1 = transports[1]->payload(0, 0) - wire::kHeaderBytes;
  ASSERT_EQ(reinterpret_cast<uintptr_t>(slotAtRank1), victim1.base);
  EXPECT_EQ(std::count(slotAtRank1, slotAtRank1 + 64, uint8_t{0xa5}), windows ? 0 : 64);
  EXPECT_EQ(attempt(attackerMesh->qp(2), IBV_WR_RDMA_WRITE, boardAt(2, 0), slotsAt(2, 0).rkey),
            expected);
  transports.clear();
}

TEST(InProcess, APeerCanOnlyWriteItsOwnSlots) {
  peerAccessCase(/*windows=*/true);
}

// The fallback docs/security.md describes for devices without type-2
// windows: the boundary is the group.
TEST(InProcess, WithoutWindowsAnotherPeersRkeyOpensItsSlots) {
  peerAccessCase(/*windows=*/false);
}

// docs/security.md, "Memory the user registered": the rkey an advert
// carries opens the whole registration, not only the advertised receive,
// and after the operation too, for as long as the memory stays registered;
// deregistering closes it. Rank 0 runs a ring allgather into registered
// memory and so sends rank 1 an advert; rank 1 takes the advert off its
// own slots, as any peer can, and writes with it through its own queue
// pair after rank 0's operation ended (timed out: rank 1 never sends).
TEST(InProcess, AnAdvertsRkeyOpensTheRegistrationUntilDeregistered) {
  HashStore store(20s);
  constexpr int kSize = 2;
  constexpr size_t kBytes = 64 << 10;
  auto [meshes, transports, errors] =
      formInProcess(store, "advert", kSize, quickConfig(), TransportOptions{.slotsPerPeer = 4});
  for (const auto& e : errors) ASSERT_EQ(e, "");
  // Rank 0: the backend's registrations, and an engine that uses them.
  RegistrationCache registered(userMemoryRegistrar(meshes[0]->pd()), true, /*pageBytes=*/1);
  PageBuffer target(kBytes);
  std::fill_n(target.data(), kBytes, uint8_t{0x11});
  registered.add(target.data(), kBytes);
  auto engine =
      std::make_unique<Engine>(std::move(transports[0]), EngineOptions{.group = "advert",
                                                                       .rank = 0,
                                                                       .size = kSize,
                                                                       .registrations = &registered,
                                                                       .zeroCopyMinBytes = 4096});
  auto work = advertisingAllgather(*engine, target.data(), kBytes, kSize);
  // Rank 1 reads what arrives in its slots.
  const std::optional<wire::Header> advert = takeAdvert(*transports[1]);
  ASSERT_TRUE(advert) << "rank 0 advertised no direct receive";
  ASSERT_EQ(advert->addr, reinterpret_cast<uintptr_t>(target.data()) + kBytes / 2);  // rank 1's
  ASSERT_EQ(advert->length, kBytes / 2);
  EXPECT_THROW(work->wait(), Error);  // over: timed out
  // Outside the advertised receive, after the operation: lands, until
  // deregistered.
  expectRkeyOpensUntilDeregistered(*meshes[1], meshes[1]->qp(0), registered, target.data(),
                                   advert->rkey);
  engine.reset();
  transports.clear();
}

TEST(InProcess, SingleRankGroupNeedsNoPeers) {
  HashStore store;
  Mesh mesh(store, 0, 1, quickConfig(), MeshOptions{.group = "solo"});
  EXPECT_EQ(mesh.size(), 1);
  EXPECT_NE(mesh.pd(), nullptr);
}

TEST(InProcess, BadDeviceChoicesNameWhatExists) {
  auto expectError = [](std::map<std::string, std::string> opts, const std::string& fragment) {
    try {
      selectEndpoint(Config::load(opts));
      ADD_FAILURE() << "no error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
    }
  };
  auto devices = listDevices();
  ASSERT_FALSE(devices.empty());
  const std::string dev = devices.front().name;
  expectError({{"RDMACC_IB_HCA", "nosuch0"}}, "devices here: " + dev);
  expectError({{"RDMACC_IB_HCA", dev + ":9"}}, "port 9 does not exist");
  expectError({{"RDMACC_IB_HCA", dev + ":x"}}, "bad port");
  expectError({{"RDMACC_IB_GID_INDEX", "77"}}, "RDMACC_IB_GID_INDEX=77 does not exist");
  expectError({{"RDMACC_SOCKET_IFNAME", "nosuch-if"}}, "RDMACC_SOCKET_IFNAME=nosuch-if");
  EXPECT_NO_THROW(selectEndpoint(Config::load({{"RDMACC_IB_HCA", dev + ":1"}})));
  expectError({{"RDMACC_IB_HCA", dev + ",nosuch0"}}, "'nosuch0', which does not exist");
  // A list: local rank r takes entry r mod n.
  auto listed = selectEndpoint(Config::load({{"RDMACC_IB_HCA", dev + "," + dev}}), 3);
  EXPECT_EQ(listed.device, dev);
  EXPECT_NE(listed.reason.find("for local rank 3"), std::string::npos) << listed.reason;
}

TEST(InProcess, RegistrationOfUnmappedMemoryFailsClearly) {
  HashStore store;
  Mesh mesh(store, 0, 1, quickConfig(), MeshOptions{.group = "memlock"});
  try {
    // Not mapped memory: registration must fail and say why.
    verbs::registerMemory(mesh.pd(), reinterpret_cast<void*>(4096), 4096,
                          verbs::kRemoteWriteAccess);
    ADD_FAILURE() << "registered unmapped memory";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Registration);
    EXPECT_NE(std::string(e.what()).find("ibv_reg_mr"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace rdmacc

int main(int argc, char** argv) {
  // Under rdmacc-run stdout is a pipe: line-buffer it so that a rank that is
  // killed after a timeout has already shown how far it got.
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  ::testing::InitGoogleTest(&argc, argv);
  if (std::getenv("WORLD_SIZE") != nullptr) {
    try {
      rdmacc::gGroup = rdmacc::groupFromEnvironment(rdmacc::Config::load());
      rdmacc::setLogPrefix(fmt::format("rank {}", rdmacc::gGroup->rank));
    } catch (const std::exception& e) {
      fmt::print(stderr, "cannot join the group: {}\n", e.what());
      return 1;
    }
  }
  return RUN_ALL_TESTS();
}
