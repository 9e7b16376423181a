#include "src/schedule/algorithms/algorithms.hpp"

namespace rdmacc::algorithms {

bool isPowerOfTwo(int size) {
  return size > 0 && (size & (size - 1)) == 0;
}

Schedule recursiveDoublingAllreduce(int rank, int size, size_t bytes, bool finalize) {
  Schedule out;
  const Range all{0, bytes};
  for (int distance = 1; distance < size; distance <<= 1) {
    int partner = rank ^ distance;
    Step s;
    s.sends.push_back(SendSpec{.peer = partner, .range = all});
    s.recvs.push_back(
        RecvSpec{.peer = partner, .range = all, .combine = Combine::Reduce, .afterSend = 0});
    out.push_back(std::move(s));
  }
  if (finalize) out.push_back(Step{.finalize = {all}});  // every rank holds the full result
  return out;
}

}  // namespace rdmacc::algorithms
