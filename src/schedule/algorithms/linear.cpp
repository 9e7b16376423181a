#include "src/schedule/algorithms/algorithms.hpp"

namespace rdmacc::algorithms {

Schedule linearGather(int rank, int size, int root, Range send,
                      const std::vector<Range>& recvBlocks) {
  if (size == 1) return {};
  Step step;
  if (rank == root) {
    for (int p = 0; p < size; ++p) {
      if (p != root)
        step.recvs.push_back(RecvSpec{p, recvBlocks[static_cast<size_t>(p)], Combine::Copy});
    }
  } else {
    step.sends.push_back(SendSpec{root, send, {}});
  }
  return Schedule{std::move(step)};
}

Schedule linearScatter(int rank, int size, int root, const std::vector<Range>& sendBlocks,
                       Range recv) {
  if (size == 1) return {};
  Step step;
  if (rank == root) {
    for (int p = 0; p < size; ++p) {
      if (p != root) step.sends.push_back(SendSpec{p, sendBlocks[static_cast<size_t>(p)], {}});
    }
  } else {
    step.recvs.push_back(RecvSpec{root, recv, Combine::Copy});
  }
  return Schedule{std::move(step)};
}

Schedule linearAllgather(int rank, int size, const std::vector<Range>& blocks) {
  if (size == 1) return {};
  Step step;
  for (int i = 1; i < size; ++i) {  // start with the right neighbour, as the ring
    int to = (rank + i) % size, from = (rank - i + size) % size;
    step.sends.push_back(SendSpec{to, blocks[static_cast<size_t>(rank)], {}});
    step.recvs.push_back(RecvSpec{from, blocks[static_cast<size_t>(from)], Combine::Copy});
  }
  return Schedule{std::move(step)};
}

Schedule linearReduceScatter(int rank, int size, const std::vector<Range>& blocks) {
  if (size == 1) return {};
  Step step;
  size_t part = blocks[static_cast<size_t>(rank)].bytes;
  for (int i = 1; i < size; ++i) {
    int to = (rank + i) % size, from = (rank - i + size) % size;
    size_t slot = static_cast<size_t>(from < rank ? from : from - 1);
    step.sends.push_back(SendSpec{to, blocks[static_cast<size_t>(to)], {}});
    step.recvs.push_back(RecvSpec{from, Range{slot * part, part}, Combine::Copy});
  }
  return Schedule{std::move(step)};
}

Schedule linearAlltoall(int rank, int size, const std::vector<Range>& sendBlocks,
                        const std::vector<Range>& recvBlocks) {
  if (size == 1) return {};
  Step step;
  for (int i = 1; i < size; ++i) {
    int to = (rank + i) % size, from = (rank - i + size) % size;
    step.sends.push_back(SendSpec{to, sendBlocks[static_cast<size_t>(to)], {}});
    step.recvs.push_back(RecvSpec{from, recvBlocks[static_cast<size_t>(from)], Combine::Copy});
  }
  return Schedule{std::move(step)};
}

}  // namespace rdmacc::algorithms
