#include "src/schedule/algorithms/algorithms.hpp"

namespace rdmacc::algorithms {
namespace {

int mod(int a, int n) {
  return ((a % n) + n) % n;
}

// n-1 steps: send block (rank + shift - s) right, receive block
// (rank + shift - s - 1) from the left. After a reducing pass, rank r holds
// the full reduction of block (r + shift + 1).
void ringPass(Schedule& out, int rank, int size, const std::vector<Range>& blocks, int shift,
              Combine combine) {
  for (int s = 0; s < size - 1; ++s) {
    Step step;
    step.sends.push_back(SendSpec{
        ringRight(rank, size), blocks[static_cast<size_t>(mod(rank + shift - s, size))], {}});
    step.recvs.push_back(RecvSpec{ringLeft(rank, size),
                                  blocks[static_cast<size_t>(mod(rank + shift - s - 1, size))],
                                  combine});
    out.push_back(std::move(step));
  }
}

}  // namespace

int ringRight(int rank, int size) {
  return (rank + 1) % size;
}
int ringLeft(int rank, int size) {
  return (rank + size - 1) % size;
}

Schedule ringAllreduce(int rank, int size, const std::vector<Range>& blocks, bool finalize) {
  Schedule out;
  if (size == 1) {
    if (finalize) out.push_back(Step{.finalize = {blocks[0]}});
    return out;
  }
  ringPass(out, rank, size, blocks, 0, Combine::Reduce);  // rank r owns block r+1
  size_t firstGather = out.size();
  ringPass(out, rank, size, blocks, 1, Combine::Copy);  // and sends it first
  if (finalize)
    out[firstGather].finalize.push_back(blocks[static_cast<size_t>(mod(rank + 1, size))]);
  return out;
}

Schedule ringReduceScatter(int rank, int size, const std::vector<Range>& blocks, bool finalize) {
  Schedule out;
  ringPass(out, rank, size, blocks, -1, Combine::Reduce);  // rank r owns block r
  if (finalize) out.push_back(Step{.finalize = {blocks[static_cast<size_t>(rank)]}});
  return out;
}

Schedule ringReduceScatterToOutput(int rank, int size, const std::vector<Range>& blocks,
                                   bool fromInput) {
  Schedule out = ringReduceScatter(rank, size, blocks, /*finalize=*/false);
  for (size_t s = 0; fromInput && s < out.size(); ++s) {
    for (SendSpec& send : out[s].sends) send.fromRecv = s > 0;  // step 0: the input's own block
    for (RecvSpec& recv : out[s].recvs) recv.combine = Combine::ReduceWithSend;
  }
  if (!out.empty()) {  // the last receive brings block `rank`: into the output
    RecvSpec& last = out.back().recvs.at(0);
    last.combine = Combine::ReduceWithSend;  // this rank's own part, from the send buffer
    last.toOutput = true;
  }
  return out;
}

Schedule ringAllgather(int rank, int size, const std::vector<Range>& blocks) {
  Schedule out;
  ringPass(out, rank, size, blocks, 0, Combine::Copy);
  return out;
}

}  // namespace rdmacc::algorithms
