// Operations as VerbsBackend builds them, for tests that drive engines
// directly (engine_test.cpp over one fake network, link_test.cpp over
// links, device tests over a device): point-to-point, a ring and a one-shot
// allreduce, a dissemination barrier, and the error a work failed with.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <vector>

#include "rdmacc/error.hpp"
#include "rdmacc/work.hpp"
#include "src/engine/engine.hpp"
#include "src/schedule/algorithms/algorithms.hpp"
#include "src/schedule/schedule.hpp"

namespace rdmacc::testing {

inline std::unique_ptr<Operation> pointToPoint(
    bool send, int peer, uint32_t tag, std::vector<uint8_t>& buffer,
    std::chrono::milliseconds timeout = std::chrono::seconds(20)) {
  auto op = std::make_unique<Operation>();
  op->type = send ? OpType::Send : OpType::Recv;
  op->pointToPoint = true;
  op->isSend = send;
  op->peer = peer;
  op->tag = tag;
  op->buffer = buffer.data();
  op->bytes = buffer.size();
  op->timeout = timeout;
  return op;
}

// An allreduce (sum) of `data` in place by `plan`.
inline std::unique_ptr<Operation> allreduce(std::shared_ptr<const Plan> plan,
                                            std::vector<int32_t>& data,
                                            std::chrono::milliseconds timeout) {
  auto op = std::make_unique<Operation>();
  op->type = OpType::Allreduce;
  op->timeout = timeout;
  op->schedule = std::move(plan);
  op->sendBase = op->recvBase = reinterpret_cast<uint8_t*>(data.data());
  op->dtype = DataType::Int32;
  op->reduceOp = ReduceOp::Sum;
  op->checkValue = data.size();
  return op;
}

// A ring allreduce (sum) of `data` in place.
inline std::unique_ptr<Operation> ringAllreduce(
    int rank, int size, std::vector<int32_t>& data,
    std::chrono::milliseconds timeout = std::chrono::seconds(20)) {
  return allreduce(
      std::make_shared<Plan>(algorithms::ringAllreduce(
                                 rank, size, evenBlocks(data.size(), size, sizeof(int32_t)), false),
                             Algorithm::Ring),
      data, timeout);
}

inline std::unique_ptr<Operation> barrier(
    int rank, int size, std::chrono::milliseconds timeout = std::chrono::seconds(20)) {
  auto op = std::make_unique<Operation>();
  op->type = OpType::Barrier;
  op->timeout = timeout;
  op->schedule =
      std::make_shared<Plan>(algorithms::disseminationBarrier(rank, size), Algorithm::Auto);
  return op;
}

// A one-shot allreduce (sum) of `data` in place through the transport's
// board (Plan::board).
inline std::unique_ptr<Operation> boardAllreduce(
    int rank, int size, std::vector<int32_t>& data,
    std::chrono::milliseconds timeout = std::chrono::seconds(20)) {
  return allreduce(boardPlan(rank, size, data.size() * sizeof(int32_t)), data, timeout);
}

// The error a failed work holds (fails the test when it succeeded).
inline Error failureOf(Work& work) {
  try {
    work.wait();
  } catch (const Error& e) {
    return e;
  }
  ADD_FAILURE() << "the work succeeded";
  return Error(ErrorKind::Internal, "no failure");
}

}  // namespace rdmacc::testing
