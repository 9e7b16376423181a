#include "src/schedule/algorithms/algorithms.hpp"

namespace rdmacc::algorithms {

Schedule pairwiseAlltoall(int rank, int size, const std::vector<Range>& sendBlocks,
                          const std::vector<Range>& recvBlocks) {
  Schedule out;
  for (int i = 1; i < size; ++i) {
    int to = (rank + i) % size, from = (rank - i + size) % size;
    Step step;
    step.sends.push_back(SendSpec{to, sendBlocks[static_cast<size_t>(to)], {}});
    step.recvs.push_back(RecvSpec{from, recvBlocks[static_cast<size_t>(from)], Combine::Copy});
    out.push_back(std::move(step));
  }
  return out;
}

}  // namespace rdmacc::algorithms
