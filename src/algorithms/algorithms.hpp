// Schedule builders, one file per algorithm. `rank` and `size` are the
// caller's place in the group; blocks are byte ranges indexed by rank.
#pragma once

#include <vector>

#include "src/schedule.hpp"

namespace rdmacc::algorithms {

// ring.cpp: reduce-scatter then allgather around the ring; each block is
// reduced by exactly one owner and copied to the others, so every rank ends
// with bitwise-identical results. finalize marks where Avg divides.
Schedule ringAllreduce(int rank, int size, const std::vector<Range>& blocks, bool finalize);
// Rank r ends with block r fully reduced (and finalised if asked).
Schedule ringReduceScatter(int rank, int size, const std::vector<Range>& blocks, bool finalize);
// Block r of every rank r reaches everyone.
Schedule ringAllgather(int rank, int size, const std::vector<Range>& blocks);
int ringRight(int rank, int size);
int ringLeft(int rank, int size);

// tree.cpp: binomial trees (and the chain, a degenerate pipeline tree)
// rooted at `root`; children are listed largest subtree first.
int binomialParent(int rank, int size, int root);  // -1 for the root
std::vector<int> binomialChildren(int rank, int size, int root);
Schedule treeBroadcast(int rank, int size, int root, size_t bytes);
Schedule chainBroadcast(int rank, int size, int root, size_t bytes);
Schedule treeReduce(int rank, int size, int root, size_t bytes);
// Reduce to rank 0, finalise there, broadcast back: one owner computes.
Schedule treeAllreduce(int rank, int size, size_t bytes, bool finalize);

// recursive_doubling.cpp: log2(size) steps; in step k rank r exchanges the
// whole buffer with r ^ 2^k and combines (a + b and b + a are the same bits,
// so every rank ends identical). size must be a power of two.
bool isPowerOfTwo(int size);
Schedule recursiveDoublingAllreduce(int rank, int size, size_t bytes, bool finalize);

// pairwise_alltoall.cpp: in step i rank r sends to r+i and receives from r-i.
Schedule pairwiseAlltoall(int rank, int size, const std::vector<Range>& sendBlocks,
                          const std::vector<Range>& recvBlocks);

// linear.cpp: ranks talk to every rank directly, in one step.
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

// dissemination_barrier.cpp: ceil(log2 n) rounds of zero-byte messages.
Schedule disseminationBarrier(int rank, int size);

}  // namespace rdmacc::algorithms
