// The executor: steps collective schedules (sends gated on receives, copies
// and reductions out of the slots, direct receives and their adverts, Avg's
// division) and point-to-point transfers, as far as the transport's credits
// and the arrivals allow. It talks to peers only through Transport and
// Matching; failures are thrown as Error for the engine to turn into a broken
// group.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "src/core/by_rank.hpp"
#include "src/engine/active.hpp"
#include "src/engine/engine.hpp"
#include "src/engine/matching.hpp"
#include "src/transport/transport.hpp"

namespace rdmacc {

// A one-shot collective whose every contribution is on the board: reduces
// them in rank order (the same bits on every rank) into call.data, divides
// for Avg, and marks them read (engine/executor_board.cpp).
void reduceBoard(Board& board, const OneShotCall& call, int rank, int size, uint64_t sequence);

class Executor {
 public:
  // `gone`: the peers that left (the engine's, updated by it) long enough ago
  // that what they sent has arrived.
  Executor(Transport& transport, Matching& matching, const EngineOptions& options,
           const ByRank<bool>& gone);

  // Starts the collective (on its first call: copy-in, prologue, adverts) and
  // moves it on; sets a.finished once every step and the epilogue are done.
  // `oldestSequence`: the oldest collective still in flight. True on progress.
  bool advanceCollective(Active& a, uint32_t oldestSequence);
  // Moves the point-to-point operations on, in submission order and one send
  // per peer at a time; completed ones finish their Work and go to `pool`.
  bool advancePointToPoint(std::vector<std::unique_ptr<Active>>& ops, ActivePool& pool);

 private:
  size_t messages(size_t bytes) const { return messageCount(bytes, chunk_); }
  void startCollective(Active& a);
  bool sendChunks(Active& a, const Step& s, size_t i, const Expectation& expected);
  bool nextStepMayBegin(const Active& a) const;
  void enterStep(Active& a);
  // A one-shot collective (Plan::board), once started (engine/executor_board.cpp).
  bool advanceBoard(Active& a);
  void prepareAdverts(Active& a);
  bool receive(Active& a, const Expectation& expected, size_t j);
  bool advanceSend(Active& a);
  bool advanceRecv(Active& a);

  Transport& transport_;
  Matching& matching_;
  const EngineOptions& options_;
  const ByRank<bool>& gone_;
  size_t chunk_;
  bool anyMemoryPeers_ = false;  // some peer writes direct receives without a registration
  ByRank<char> streaming_;       // advancePointToPoint: peers with a send in progress
};

}  // namespace rdmacc
