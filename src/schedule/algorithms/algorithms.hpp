// Schedule builders, one file per algorithm. `rank` and `size` are the
// caller's place in the group; blocks are byte ranges indexed by rank.
#pragma once

#include <vector>

#include "src/schedule/schedule.hpp"

namespace rdmacc::algorithms {

// schedule/algorithms/ring.cpp: reduce-scatter then allgather around the ring; each block is
// reduced by exactly one owner and copied to the others, so every rank ends
// with bitwise-identical results. finalize marks where Avg divides.
Schedule ringAllreduce(int rank, int size, const std::vector<Range>& blocks, bool finalize);
// Rank r ends with block r fully reduced (and finalised if asked).
Schedule ringReduceScatter(int rank, int size, const std::vector<Range>& blocks, bool finalize);
// The same with block r written straight into the output buffer
// (RecvSpec::toOutput): the last receive combines this rank's part of block
// r, read from the send buffer, with the incoming partial sum. fromInput: the
// send buffer is the caller's input (never written) and partial sums go only
// to the receive buffer (laid out like the input): each rank receives every
// block but its first once, so each receive combines the input's block with
// the incoming partial sum (ReduceWithSend), and steps after the first
// forward what the previous one produced; no copy of the input first.
// Otherwise send and receive buffer are one (the inputs packed into it).
// No finalisation (Avg divides the output afterwards); size 1 has no steps:
// the caller copies its block.
Schedule ringReduceScatterToOutput(int rank, int size, const std::vector<Range>& blocks,
                                   bool fromInput);
// Block r of every rank r reaches everyone.
Schedule ringAllgather(int rank, int size, const std::vector<Range>& blocks);
int ringRight(int rank, int size);
int ringLeft(int rank, int size);

// schedule/algorithms/tree.cpp: binomial trees (and the chain, a degenerate pipeline tree)
// rooted at `root`; children are listed largest subtree first.
int binomialParent(int rank, int size, int root);  // -1 for the root
std::vector<int> binomialChildren(int rank, int size, int root);
Schedule treeBroadcast(int rank, int size, int root, size_t bytes);
Schedule chainBroadcast(int rank, int size, int root, size_t bytes);
Schedule treeReduce(int rank, int size, int root, size_t bytes);
// Reduce to rank 0, finalise there, broadcast back: one owner computes.
Schedule treeAllreduce(int rank, int size, size_t bytes, bool finalize);

// schedule/algorithms/recursive_doubling.cpp: log2(size) steps; in step k rank r exchanges the
// whole buffer with r ^ 2^k and combines (a + b and b + a are the same bits,
// so every rank ends identical). size must be a power of two.
bool isPowerOfTwo(int size);
Schedule recursiveDoublingAllreduce(int rank, int size, size_t bytes, bool finalize);

// schedule/algorithms/pairwise_alltoall.cpp: in step i rank r sends to r+i and receives from r-i.
Schedule pairwiseAlltoall(int rank, int size, const std::vector<Range>& sendBlocks,
                          const std::vector<Range>& recvBlocks);

// schedule/algorithms/linear.cpp: ranks talk to every rank directly, in one step.
Schedule linearGather(int rank, int size, int root, Range send,
                      const std::vector<Range>& recvBlocks);
Schedule linearScatter(int rank, int size, int root, const std::vector<Range>& sendBlocks,
                       Range recv);
// Every rank sends its block to every other rank at once: one step instead of
// the ring's n-1 hops (latency-bound sizes).
Schedule linearAllgather(int rank, int size, const std::vector<Range>& blocks);
// Rank p gets block p of every rank's send buffer in one step, into its
// receive buffer as n-1 blocks of blocks[rank].bytes in rank order (itself
// skipped); the caller combines them (reduce-scatter for latency-bound sizes).
Schedule linearReduceScatter(int rank, int size, const std::vector<Range>& blocks);
// Every pair exchanges at once (pairwise's n-1 steps as one).
Schedule linearAlltoall(int rank, int size, const std::vector<Range>& sendBlocks,
                        const std::vector<Range>& recvBlocks);

// schedule/algorithms/dissemination_barrier.cpp: ceil(log2 n) rounds of zero-byte messages.
Schedule disseminationBarrier(int rank, int size);

// The group's ranks by host (the same on every rank): host h's ranks in
// ascending order, hosts numbered from 0 in order of their lowest rank.
struct Hosts {
  Hosts() = default;
  explicit Hosts(std::vector<int> hostOfRank);  // throws std::invalid_argument if misnumbered
  static Hosts single(int size);                // every rank on one host
  std::vector<int> hostOf;                      // by rank
  std::vector<std::vector<int>> members;        // by host
  int size() const { return static_cast<int>(hostOf.size()); }
  int count() const { return static_cast<int>(members.size()); }
  int host(int rank) const { return hostOf[static_cast<size_t>(rank)]; }
  int localIndex(int rank) const;
  size_t largest() const;  // ranks on the most populated host
  bool uniform() const;    // every host has as many ranks
  // Whether a hierarchy differs from the flat group: several hosts, one of
  // them with several ranks.
  bool layered() const { return count() > 1 && largest() > 1; }
  // Every host's ranks are consecutive (as torchrun and mpirun --map-by node
  // number them): a chain or binomial tree in rank order then crosses the
  // network about as seldom as the hierarchical one.
  bool contiguous() const;
};

// schedule/algorithms/hierarchical.cpp: through each host, then across hosts (see there).
// Allreduce: with `split` and the same number of ranks L on every host,
// reduce-scatter inside hosts, L concurrent ring allreduces across hosts
// (one per local index, each over 1/L of the data), allgather inside hosts;
// otherwise reduce to one leader per host, allreduce among the leaders
// (ring with `split`, else recursive doubling or tree), broadcast inside.
Schedule hierarchicalAllreduce(int rank, const Hosts& hosts, size_t count, size_t elementSize,
                               bool finalize, bool split);
// One pipelined tree: a tree over the hosts' leaders (`root` leads its
// host) with a tree over each host's ranks below its leader; binomial trees,
// or with `chain` chains (large messages: one copy forwarded per rank).
Schedule hierarchicalBroadcast(int rank, const Hosts& hosts, int root, size_t bytes, bool chain);
Schedule hierarchicalReduce(int rank, const Hosts& hosts, int root, size_t bytes, bool chain);
// Arrive at the host's leader, dissemination among leaders, release.
Schedule hierarchicalBarrier(int rank, const Hosts& hosts);

}  // namespace rdmacc::algorithms
