#include "tests/device/in_process.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <exception>
#include <thread>

#include "src/schedule/algorithms/algorithms.hpp"
#include "src/schedule/schedule.hpp"
#include "src/transport/rdma/transport.hpp"
#include "src/transport/registration_cache.hpp"
#include "src/transport/wire.hpp"
#include "verbs/error.hpp"

namespace rdmacc {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

Config quickConfig(std::map<std::string, std::string> extra) {
  extra.emplace("RDMACC_CONNECT_TIMEOUT", "4s");
  return Config::load(extra);
}

InProcessGroup formInProcess(Store& store, const std::string& group, int size, const Config& config,
                             TransportOptions options) {
  const auto n = static_cast<size_t>(size);
  InProcessGroup g{std::vector<std::unique_ptr<Mesh>>(n),
                   std::vector<std::unique_ptr<Transport>>(n), std::vector<std::string>(n)};
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      const auto i = static_cast<size_t>(r);
      try {
        g.meshes[i] = std::make_unique<Mesh>(
            store, r, size, config, MeshOptions{.group = group, .transportConnects = true});
        TransportOptions mine = options;
        mine.group = group;
        mine.rank = r;
        mine.size = size;
        g.transports[i] = makeRdmaTransport(*g.meshes[i], store, mine);
      } catch (const std::exception& e) {
        g.errors[i] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  return g;
}

ibv_wc_status rawTransfer(Mesh& mesh, ibv_qp* qp, ibv_wr_opcode opcode, uint8_t* local,
                          uint32_t lkey, uint64_t remote, uint32_t rkey) {
  static std::atomic<uint64_t> nextId{1000};
  ibv_sge sge{.addr = reinterpret_cast<uintptr_t>(local), .length = 64, .lkey = lkey};
  ibv_send_wr wr{};
  wr.wr_id = ++nextId;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = opcode;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.wr.rdma.remote_addr = remote;
  wr.wr.rdma.rkey = rkey;
  ibv_send_wr* bad = nullptr;
  EXPECT_EQ(ibv_post_send(qp, &wr, &bad), 0);
  const auto deadline = Clock::now() + 20s;
  while (Clock::now() < deadline) {
    std::array<ibv_wc, 4> wcs;
    const int n = mesh.cq().poll(wcs);
    for (int i = 0; i < n; ++i) {
      if (wcs[static_cast<size_t>(i)].wr_id == wr.wr_id) return wcs[static_cast<size_t>(i)].status;
    }
  }
  ADD_FAILURE() << "no completion";
  return IBV_WC_GENERAL_ERR;
}

std::shared_ptr<Work> advertisingAllgather(Engine& engine, uint8_t* target, size_t bytes,
                                           int size) {
  auto op = std::make_unique<Operation>();
  op->type = OpType::AllgatherBase;
  op->timeout = 3s;
  op->schedule = std::make_shared<Plan>(
      algorithms::ringAllgather(0, size, evenBlocks(bytes, size, 1)), Algorithm::Ring);
  op->sendBase = op->recvBase = target;
  op->dtype = DataType::UInt8;
  op->checkValue = bytes;
  return engine.submit(std::move(op));
}

std::optional<wire::Header> takeAdvert(Transport& transport) {
  struct Reader final : TransportSink {
    Transport& transport;
    std::optional<wire::Header> advert;
    explicit Reader(Transport& t) : transport(t) {}
    void arrived(int peer, const Incoming& in) override {
      if (in.header.kind == wire::MessageKind::Advert) advert = in.header;
      transport.release(peer, in.slot);
    }
    void failed(int, Error) override {}
  } reader(transport);
  for (auto until = Clock::now() + 20s; !reader.advert && Clock::now() < until;) {
    transport.poll(reader);
  }
  return reader.advert;
}

void expectRkeyOpensUntilDeregistered(Mesh& attacker, ibv_qp* qp, RegistrationCache& registered,
                                      uint8_t* target, uint32_t rkey) {
  PageBuffer local(4096);
  auto mr =
      verbs::registerMemory(attacker.pd(), local.data(), local.size(), IBV_ACCESS_LOCAL_WRITE);
  const auto at = reinterpret_cast<uintptr_t>(target);
  std::fill_n(local.data(), 64, uint8_t{0x5a});
  EXPECT_EQ(rawTransfer(attacker, qp, IBV_WR_RDMA_WRITE, local.data(), mr->lkey, at, rkey),
            IBV_WC_SUCCESS);
  EXPECT_EQ(std::count(target, target + 64, uint8_t{0x5a}), 64);
  registered.remove(target);
  std::fill_n(local.data(), 64, uint8_t{0x77});
  EXPECT_EQ(rawTransfer(attacker, qp, IBV_WR_RDMA_WRITE, local.data(), mr->lkey, at, rkey),
            IBV_WC_REM_ACCESS_ERR);
  EXPECT_EQ(std::count(target, target + 64, uint8_t{0x5a}), 64);
}

}  // namespace rdmacc
