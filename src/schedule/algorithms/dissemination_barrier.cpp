#include "src/schedule/algorithms/algorithms.hpp"

namespace rdmacc::algorithms {

Schedule disseminationBarrier(int rank, int size) {
  Schedule out;
  for (int d = 1; d < size; d <<= 1) {
    Step step;
    step.sends.push_back(SendSpec{(rank + d) % size, Range{}, {}});
    step.recvs.push_back(RecvSpec{(rank - d + size) % size, Range{}, Combine::Copy});
    out.push_back(std::move(step));
  }
  return out;
}

}  // namespace rdmacc::algorithms
