// Point to point, barriers and sequence numbers, callbacks, overlapping
// collectives, bad input and allocations per operation on a real device.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <limits>

#include <fmt/format.h>

#include <future>
#include <mutex>
#include <thread>
#include "rdmacc/error.hpp"
#include "src/reduce/reduce.hpp"

#include <fmt/ranges.h>

#include "rdmacc/log.hpp"
#include "tests/device/allocation_count.hpp"

#include "tests/device/collectives.hpp"

namespace rdmacc::suite {
namespace {

using namespace std::chrono_literals;

// ---------------------------------------------------------- point to point --

TEST(PointToPoint, SendRecvWithTagsInAnyOrder) {
  if (N < 2) GTEST_SKIP() << "needs two ranks";
  int right = (R + 1) % N, left = (R + N - 1) % N;
  // Two messages to the right with tags 1 and 2; receive them in reverse order.
  Buffer a = contribution(DataType::Float32, ReduceOp::Sum, 7, R, 7001);
  Buffer b = contribution(DataType::Float32, ReduceOp::Sum, 5000, R, 7002);
  Buffer ra(DataType::Float32, 7), rb(DataType::Float32, 5000);
  std::vector<Tensor> ta{a.tensor()}, tb{b.tensor()}, tra{ra.tensor()}, trb{rb.tensor()};
  auto recv2 = gBackend->recv(trb, left, 2);
  auto recv1 = gBackend->recv(tra, left, 1);
  auto send1 = gBackend->send(ta, right, 1);
  auto send2 = gBackend->send(tb, right, 2);
  send1->wait();
  send2->wait();
  recv1->wait();
  recv2->wait();
  EXPECT_EQ(recv1->sourceRank(), left);
  expectValues(ra, DataType::Float32, left, 0, 7, 7001, "recv tag 1");
  expectValues(rb, DataType::Float32, left, 0, 5000, 7002, "recv tag 2");
  // Zero-length messages.
  Buffer z(DataType::Int8, 0), rz(DataType::Int8, 0);
  std::vector<Tensor> tz{z.tensor()}, trz{rz.tensor()};
  auto r0 = gBackend->recv(trz, left, 9);
  gBackend->send(tz, right, 9)->wait();
  r0->wait();
}

// More messages of one tag than the receiver has slots for the sender, then
// one of another tag that the receiver takes first; then messages sent
// before an allreduce that their receiver joins before receiving them. Both
// orders need the early messages copied out of their slots (decision 018):
// without that the peer cannot send what the receiver waits for.
TEST(PointToPoint, MessagesReceivedLaterThanOthersDoNotBlockThem) {
  if (N < 2) GTEST_SKIP() << "needs two ranks";
  const int right = (R + 1) % N, left = (R + N - 1) % N;
  constexpr int kEarly = 12;  // three times the suite's 4 slots per peer
  std::vector<Buffer> out, in;
  for (int m = 0; m <= kEarly; ++m) {
    out.push_back(contribution(DataType::Int32, ReduceOp::Sum, 100, R, 7100 + m));
    in.emplace_back(DataType::Int32, 100);
  }
  std::vector<std::vector<Tensor>> to, from;
  for (int m = 0; m <= kEarly; ++m) {
    to.push_back({out[m].tensor()});
    from.push_back({in[m].tensor()});
  }
  std::vector<std::shared_ptr<Work>> sends;
  for (int m = 0; m <= kEarly; ++m)
    sends.push_back(gBackend->send(to[m], right, m < kEarly ? 11 : 12));
  EXPECT_TRUE(gBackend->recv(from[kEarly], left, 12)->wait(60s)) << "tag 12 behind tag 11";
  for (int m = 0; m < kEarly; ++m) EXPECT_TRUE(gBackend->recv(from[m], left, 11)->wait(60s));
  for (auto& s : sends) EXPECT_TRUE(s->wait(60s));
  for (int m = 0; m <= kEarly; ++m) {
    expectValues(in[m], DataType::Int32, left, 0, 100, 7100 + m, fmt::format("message {}", m));
  }

  sends.clear();
  for (int m = 0; m < kEarly; ++m) sends.push_back(gBackend->send(to[m], right, 13));
  Buffer sum = contribution(DataType::Int32, ReduceOp::Sum, 1000, R, 7200);
  std::vector<Tensor> ts{sum.tensor()};
  EXPECT_TRUE(gBackend->allreduce(ts)->wait(60s)) << "allreduce behind early messages";
  expectReduced(sum, ReduceOp::Sum, 0, 1000, 7200, "allreduce");
  for (int m = 0; m < kEarly; ++m) EXPECT_TRUE(gBackend->recv(from[m], left, 13)->wait(60s));
  for (auto& s : sends) EXPECT_TRUE(s->wait(60s));
  for (int m = 0; m < kEarly; ++m) {
    expectValues(in[m], DataType::Int32, left, 0, 100, 7100 + m, fmt::format("message {}", m));
  }
}

// A wait with a timeout returns when it expires even while the waiting thread
// drives progress itself, and the operation carries on.
TEST(PointToPoint, WaitTimeoutExpiresAndTheOperationContinues) {
  if (N < 2) GTEST_SKIP() << "needs two ranks";
  if (R == 0) {
    Buffer got(DataType::Int32, 5);
    std::vector<Tensor> t{got.tensor()};
    auto w = gBackend->recv(t, 1, 78);
    auto start = std::chrono::steady_clock::now();
    try {
      w->wait(100ms);
      ADD_FAILURE() << "the wait returned before rank 1 sent";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::Timeout) << e.what();
    }
    auto took = std::chrono::steady_clock::now() - start;
    EXPECT_GE(took, 100ms);
    EXPECT_LT(took, 5s);
    EXPECT_FALSE(w->isCompleted());
    gBackend->barrier()->wait();  // rank 1 sends after this
    w->wait();
    expectValues(got, DataType::Int32, 1, 0, 5, 7200, "recv after a timed-out wait");
  } else {
    gBackend->barrier()->wait();
    if (R == 1) {
      Buffer mine = contribution(DataType::Int32, ReduceOp::Sum, 5, R, 7200);
      std::vector<Tensor> t{mine.tensor()};
      gBackend->send(t, 0, 78)->wait();
    }
  }
  gBackend->barrier()->wait();
}

TEST(PointToPoint, RecvAnysourceReportsTheSource) {
  if (N < 2) GTEST_SKIP() << "needs two ranks";
  // Everyone else sends its rank to rank 0.
  if (R == 0) {
    std::vector<int> seen;
    for (int i = 1; i < N; ++i) {
      Buffer got(DataType::Int32, 3);
      std::vector<Tensor> t{got.tensor()};
      auto w = gBackend->recvAnysource(t, 77);
      w->wait();
      int src = w->sourceRank();
      ASSERT_GE(src, 1);
      expectValues(got, DataType::Int32, src, 0, 3, 7100, "recvAnysource");
      seen.push_back(src);
    }
    std::sort(seen.begin(), seen.end());
    for (int i = 1; i < N; ++i) EXPECT_EQ(seen[static_cast<size_t>(i - 1)], i);
  } else {
    Buffer mine = contribution(DataType::Int32, ReduceOp::Sum, 3, R, 7100);
    std::vector<Tensor> t{mine.tensor()};
    gBackend->send(t, 0, 77)->wait();
  }
  gBackend->barrier()->wait();
}

// ----------------------------------------------------- barriers, sequence --

TEST(Collectives, BarrierSequenceAndMonitoredBarrier) {
  for (Algorithm a : {Algorithm::Auto, Algorithm::Dissemination, Algorithm::Hierarchical}) {
    for (int i = 0; i < 5; ++i) gBackend->barrier(BarrierOptions{.algorithm = a})->wait();
  }
  gBackend->setSequenceNumberForGroup();
  uint64_t before = gBackend->getSequenceNumberForGroup();
  gBackend->barrier()->wait();
  EXPECT_EQ(gBackend->getSequenceNumberForGroup(), before + 1);
  // Every rank must agree on the sequence number: allgather it.
  Buffer mine(DataType::Int64, 1), all(DataType::Int64, static_cast<size_t>(N));
  mine.set(0, static_cast<double>(gBackend->getSequenceNumberForGroup()));
  Tensor in = mine.tensor(), out = all.tensor();
  gBackend->_allgather_base(out, in)->wait();
  for (int r = 0; r < N; ++r) EXPECT_EQ(all.get(static_cast<size_t>(r)), mine.get(0));
  gBackend->monitoredBarrier(BarrierOptions{.timeout = 30s}, true);
}

TEST(Collectives, WorkCallbacksAndAsyncQueue) {
  // Many ops in flight at once complete in order; then() runs for each.
  std::vector<Buffer> bufs;
  for (int i = 0; i < 20; ++i)
    bufs.push_back(
        contribution(DataType::Float32, ReduceOp::Sum, 100 + static_cast<size_t>(i), R, 8000 + i));
  std::vector<std::shared_ptr<Work>> works;
  std::atomic<int> callbacks{0};
  for (auto& b : bufs) {
    std::vector<Tensor> t{b.tensor()};
    works.push_back(gBackend->allreduce(t));
    works.back()->then([&](Work& w) {
      if (w.isSuccess()) ++callbacks;
    });
  }
  for (auto& w : works) w->wait();
  EXPECT_EQ(callbacks.load(), 20);
  for (int i = 0; i < 20; ++i)
    expectReduced(bufs[static_cast<size_t>(i)], ReduceOp::Sum, 0,
                  bufs[static_cast<size_t>(i)].numel(), 8000 + i, "queued allreduce");
  EXPECT_TRUE(works.back()->isCompleted());
}

// then() runs on the thread that completes the work, which may hold the
// progress lock (a waiting caller driving progress, or the engine thread):
// a small allreduce called from there must submit, not try the lock its
// own thread holds (the RDMA board's fast path takes it) or deadlock.
TEST(Collectives, ACollectiveCalledFromACallbackCompletes) {
  std::vector<float> first(2, static_cast<float>(R)), second(2, static_cast<float>(R + 1));
  std::promise<std::shared_ptr<Work>> inner;
  auto future = inner.get_future();
  std::vector<Tensor> t{Tensor{first.data(), first.size(), DataType::Float32}};
  auto outer = gBackend->allreduce(t);
  outer->then([&](Work& done) {
    ASSERT_TRUE(done.isSuccess());
    std::vector<Tensor> s{Tensor{second.data(), second.size(), DataType::Float32}};
    inner.set_value(gBackend->allreduce(s));
  });
  outer->wait();
  ASSERT_EQ(future.wait_for(30s), std::future_status::ready);
  auto work = future.get();
  work->wait();
  const float n = static_cast<float>(N);
  for (float v : first) EXPECT_EQ(v, n * (n - 1) / 2);
  for (float v : second) EXPECT_EQ(v, n * (n + 1) / 2);
}

// Collectives issued without waiting run together when their buffers are
// independent (RDMACC_COLLECTIVES_IN_FLIGHT) and in order when one works on
// the result of another; either way they complete in submission order.
TEST(Collectives, IndependentCollectivesOverlapDependentOnesKeepTheirOrder) {
  const float n = static_cast<float>(N);
  std::vector<std::vector<float>> independent(12, std::vector<float>(33));
  std::vector<float> chain(50, static_cast<float>(R + 1));
  std::vector<float> root(20, static_cast<float>(R == N - 1 ? 7 : -1));
  std::vector<float> part(9, static_cast<float>(R)), gathered(9 * static_cast<size_t>(N), -1.0f);
  for (size_t k = 0; k < independent.size(); ++k) {
    std::fill(independent[k].begin(), independent[k].end(), static_cast<float>(R + k));
  }
  auto tensor = [](std::vector<float>& v) { return Tensor{v.data(), v.size(), DataType::Float32}; };
  std::vector<std::shared_ptr<Work>> works;
  std::mutex orderMutex;
  std::vector<uint64_t> order;
  auto track = [&](std::shared_ptr<Work> w) {
    w->then([&](Work& done) {
      std::lock_guard lock(orderMutex);
      order.push_back(done.sequenceNumber());
    });
    works.push_back(std::move(w));
  };
  for (size_t k = 0; k < independent.size(); ++k) {
    std::vector<Tensor> t{tensor(independent[k])};
    track(gBackend->allreduce(t));
    if (k == 3 || k == 7) {  // the chain: each allreduce sums the previous result
      std::vector<Tensor> c{tensor(chain)};
      track(gBackend->allreduce(c));
    }
    if (k == 5) {
      std::vector<Tensor> b{tensor(root)};
      track(gBackend->broadcast(b, BroadcastOptions{.rootRank = N - 1}));
      Tensor out = tensor(gathered), in = tensor(part);
      track(gBackend->_allgather_base(out, in));
    }
  }
  for (auto& w : works) w->wait();
  for (size_t k = 0; k < independent.size(); ++k) {
    const float want = n * (n - 1) / 2 + n * static_cast<float>(k);
    for (float x : independent[k]) ASSERT_EQ(x, want) << "allreduce " << k;
  }
  const float once = n * (n + 1) / 2;
  for (float x : chain) ASSERT_EQ(x, n * once) << "the second allreduce of the chain";
  for (float x : root) ASSERT_EQ(x, 7.0f);
  for (int r = 0; r < N; ++r) {
    for (size_t i = 0; i < part.size(); ++i) {
      ASSERT_EQ(gathered[static_cast<size_t>(r) * part.size() + i], static_cast<float>(r));
    }
  }
  std::lock_guard lock(orderMutex);
  ASSERT_EQ(order.size(), works.size());
  EXPECT_TRUE(std::is_sorted(order.begin(), order.end()))
      << fmt::format("{}", fmt::join(order, " "));
}

// An in-place alltoall_base issued while an allreduce on the same tensor
// still runs must send the allreduce's result, as a stream would: its copy
// of the input is made when it starts, not when it is called. (It was made
// at the call, so the peers received the tensor as it was before the
// allreduce.) Large enough that the allreduce is still running when the
// alltoall is submitted.
TEST(Collectives, AnInPlaceAlltoallSendsTheResultOfTheAllreduceBeforeIt) {
  const size_t n = static_cast<size_t>(N);
  // Elements per rank's block; every sum below 2^24, exact in float.
  const size_t block = std::min<size_t>(131072, (size_t{1} << 23) / (n * n));
  std::vector<float> x(block * n);
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(R * 100) + static_cast<float>(i);
  std::vector<Tensor> t{Tensor{x.data(), x.size(), DataType::Float32}};
  auto summed = gBackend->allreduce(t);
  Tensor all{x.data(), x.size(), DataType::Float32};
  std::vector<int64_t> even;
  auto exchanged = gBackend->alltoall_base(all, all, even, even);
  summed->wait();
  exchanged->wait();
  // After the allreduce every rank holds s[i] = 100 N(N-1)/2 + N i; block r
  // of this rank's output is block R of rank r's s, the same on every rank.
  const float base = 100.0f * static_cast<float>(N * (N - 1) / 2);
  for (size_t r = 0; r < n; ++r) {
    for (size_t j = 0; j < block; ++j) {
      const size_t i = static_cast<size_t>(R) * block + j;
      ASSERT_EQ(x[r * block + j], base + static_cast<float>(n * i))
          << "element " << j << " of the block from rank " << r;
    }
  }
}

// Small allreduces (one-shot through the board when every rank shares the
// host; the fast path on the caller's thread when nothing is pending): one
// queued behind an async op reads that op's result, one with a late rank
// waits for it past the others' spin (the engine takes over and is woken by
// the late post), and many in a row reuse every board entry many times.
TEST(Collectives, SmallAllreducesSeeEarlierOpsWaitForLateRanksAndReuseTheBoard) {
  const float n = static_cast<float>(N);
  std::vector<float> x(65536, 1.0f);
  std::vector<Tensor> whole{Tensor{x.data(), x.size(), DataType::Float32}};
  auto first = gBackend->allreduce(whole);
  std::vector<Tensor> head{Tensor{x.data(), 2, DataType::Float32}};
  auto second = gBackend->allreduce(head);
  second->wait();
  first->wait();
  EXPECT_EQ(x[0], n * n) << "the small allreduce ran before the one it depends on";
  EXPECT_EQ(x[2], n);

  float late[2] = {static_cast<float>(R), 1.0f};
  if (R == 0) std::this_thread::sleep_for(30ms);
  std::vector<Tensor> tl{Tensor{late, 2, DataType::Float32}};
  gBackend->allreduce(tl)->wait();
  EXPECT_EQ(late[0], n * (n - 1) / 2);
  EXPECT_EQ(late[1], n);

  for (int i = 0; i < 100; ++i) {
    int64_t v[3] = {R + i, int64_t{1} << R, -i};
    std::vector<Tensor> tv{Tensor{v, 3, DataType::Int64}};
    gBackend->allreduce(tv, AllreduceOptions{.reduceOp = i % 2 ? ReduceOp::Sum : ReduceOp::Max})
        ->wait();
    if (i % 2) {
      ASSERT_EQ(v[0], N * (N - 1) / 2 + N * i) << "round " << i;
      ASSERT_EQ(v[1], (int64_t{1} << N) - 1) << "round " << i;
      ASSERT_EQ(v[2], -N * i) << "round " << i;
    } else {
      ASSERT_EQ(v[0], N - 1 + i) << "round " << i;
      ASSERT_EQ(v[1], int64_t{1} << (N - 1)) << "round " << i;
      ASSERT_EQ(v[2], -i) << "round " << i;
    }
  }
}

// ------------------------------------------------------------ bad input --

TEST(Collectives, InvalidCallsThrowOnEveryRankBeforeAnyDataMoves) {
  auto expectInvalid = [](const std::function<void()>& call, const std::string& fragment) {
    try {
      call();
      ADD_FAILURE() << "no error; expected " << fragment;
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::InvalidArgument) << e.what();
      EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
    }
  };
  Buffer f(DataType::Float32, 4), b(DataType::Bool, 4);
  std::vector<Tensor> tf{f.tensor()}, tb{b.tensor()}, none;
  expectInvalid([&] { gBackend->allreduce(tf, AllreduceOptions{.reduceOp = ReduceOp::BXor}); },
                "bxor is not defined for float32");
  expectInvalid([&] { gBackend->allreduce(tb, AllreduceOptions{.reduceOp = ReduceOp::Avg}); },
                "avg is not defined for bool");
  expectInvalid([&] { gBackend->allreduce(none); }, "exactly one tensor");
  expectInvalid([&] { gBackend->broadcast(tf, BroadcastOptions{.rootRank = N}); },
                fmt::format("root rank {} is not in [0, {})", N, N));
  expectInvalid([&] { gBackend->reduce(tf, ReduceOptions{.rootRank = -1}); }, "root rank -1");
  // A call's algorithm must be one of its collective's (RDMACC_ALGO_* and
  // the tuning table are checked when read).
  expectInvalid([&] { gBackend->allreduce(tf, AllreduceOptions{.algorithm = Algorithm::Linear}); },
                "allreduce has no linear algorithm");
  expectInvalid([&] { gBackend->reduce(tf, ReduceOptions{.algorithm = Algorithm::Ring}); },
                "reduce has no ring algorithm");
  {  // the same check for the collectives whose builders used to choose themselves
    Buffer whole(DataType::Float32, 4 * static_cast<size_t>(N));
    Tensor part = f.tensor(), all = whole.tensor();
    expectInvalid(
        [&] {
          gBackend->_allgather_base(all, part, AllgatherOptions{.algorithm = Algorithm::Tree});
        },
        "allgather has no tree algorithm");
    expectInvalid(
        [&] {
          gBackend->_reduce_scatter_base(part, all,
                                         ReduceScatterOptions{.algorithm = Algorithm::Pairwise});
        },
        "reduce_scatter has no pairwise algorithm");
    std::vector<int64_t> even;
    expectInvalid(
        [&] {
          gBackend->alltoall_base(all, all, even, even,
                                  AllToAllOptions{.algorithm = Algorithm::Ring});
        },
        "alltoall has no ring algorithm");
  }
  if (N > 1 && (N & (N - 1)) != 0) {
    expectInvalid(
        [&] {
          gBackend->allreduce(tf, AllreduceOptions{.algorithm = Algorithm::RecursiveDoubling});
        },
        "recursive doubling needs a power-of-two group");
  }
  expectInvalid([&] { gBackend->send(tf, R, 0); }, "is not another rank");
  expectInvalid([&] { gBackend->recv(tf, 0, -3); }, N > 1 && R != 0 ? "tag -3 is negative" : "");
  Tensor out = f.tensor(), in = f.tensor();
  if (N > 1)
    expectInvalid([&] { gBackend->_allgather_base(out, in); },
                  "_allgather_base: the output must be");
  std::vector<int64_t> bad{1}, empty;
  if (N > 1) expectInvalid([&] { gBackend->alltoall_base(out, in, empty, bad); }, "split sizes");
  // The group still works afterwards.
  gBackend->barrier()->wait();
}

// Operations that repeat (a training loop's) allocate their Work and their
// Operation on the caller's thread and nothing else: schedules are shared,
// the engine reuses its per-operation state, and its queues, polling and
// spinning never allocate. Counted over every thread of the process by the
// replaced operator new below; a count, not a timing.
TEST(Allocations, RepeatedOperationsAllocateOnlyTheirWorkAndOperation) {
  std::vector<float> data(8, 1.0f), gathered(8 * static_cast<size_t>(N)), peerData(8, 0.0f);
  std::vector<Tensor> one{Tensor{data.data(), data.size(), DataType::Float32}};
  std::vector<Tensor> p2p{Tensor{peerData.data(), peerData.size(), DataType::Float32}};
  Tensor in{data.data(), data.size(), DataType::Float32};
  Tensor out{gathered.data(), gathered.size(), DataType::Float32};
  int ops = 0;
  auto round = [&] {
    gBackend->allreduce(one)->wait();
    gBackend->broadcast(one, BroadcastOptions{.rootRank = N - 1})->wait();
    gBackend->_allgather_base(out, in)->wait();
    gBackend->barrier()->wait();
    ops += 4;
    if (N >= 2 && R < 2) {  // a send and a receive between ranks 0 and 1
      if (R == 0) gBackend->send(p2p, 1, 5)->wait();
      gBackend->recv(p2p, 1 - R, 5)->wait();
      if (R == 1) gBackend->send(p2p, 0, 5)->wait();
      ops += 2;
    }
  };
  for (int i = 0; i < 20; ++i) round();  // pools, the schedule cache and the queues fill
  ops = 0;
  const uint64_t before = rdmacc::test::allocationCount();
  for (int i = 0; i < 100; ++i) round();
  const uint64_t counted = rdmacc::test::allocationCount() - before;
  fmt::print("rank {}: {} allocations for {} operations\n", R, counted, ops);
  // Two per operation (Work, Operation), and a little for queues that grow
  // in blocks (the engine's list of collectives).
  EXPECT_LE(counted, static_cast<uint64_t>(2 * ops + 16))
      << counted << " allocations for " << ops << " operations";
}

}  // namespace
}  // namespace rdmacc::suite
