#include "src/schedule/schedule.hpp"

#include <algorithm>
#include <utility>

namespace rdmacc {
namespace {

// Widens `extent` to cover `r` (empty ranges cover nothing).
void cover(Range& extent, const Range& r) {
  if (r.bytes == 0) return;
  if (extent.bytes == 0) {
    extent = r;
    return;
  }
  const size_t lo = std::min(extent.offset, r.offset);
  const size_t hi = std::max(extent.offset + extent.bytes, r.offset + r.bytes);
  extent = Range{lo, hi - lo};
}

}  // namespace

Plan::Plan(Schedule s, Algorithm a) : steps(std::move(s)), algorithm(a) {
  std::vector<bool> named;
  auto name = [&](int peer) {
    if (peer < 0) return;
    if (static_cast<size_t>(peer) >= named.size()) named.resize(static_cast<size_t>(peer) + 1);
    if (!named[static_cast<size_t>(peer)]) peers.push_back(peer);
    named[static_cast<size_t>(peer)] = true;
  };
  for (const Step& step : steps) {
    for (const SendSpec& send : step.sends) name(send.peer);
    for (const RecvSpec& recv : step.recvs) name(recv.peer);
  }
  for (const Step& step : steps) {
    for (const SendSpec& send : step.sends) {
      largestSend = std::max(largestSend, send.range.bytes);
      cover(send.fromRecv ? recvExtent : sendExtent, send.range);
    }
    for (const RecvSpec& recv : step.recvs) {
      cover(recv.toOutput ? outExtent : recvExtent, recv.range);
      if (recv.combine == Combine::ReduceWithSend) cover(sendExtent, recv.range);
    }
    for (const Range& r : step.finalize) cover(recvExtent, r);
  }
}

std::shared_ptr<Plan> boardPlan(int rank, int size, size_t bytes) {
  Step step;
  for (int peer = 0; peer < size; ++peer) {
    if (peer == rank) continue;
    step.sends.push_back(SendSpec{.peer = peer, .range = {0, bytes}});
    step.recvs.push_back(RecvSpec{.peer = peer, .range = {0, bytes}, .combine = Combine::Reduce});
  }
  auto plan = std::make_shared<Plan>(Schedule{std::move(step)});
  plan->board = true;
  return plan;
}

std::vector<Range> evenBlocks(size_t count, int parts, size_t elementSize) {
  std::vector<Range> blocks(static_cast<size_t>(parts));
  size_t base = count / static_cast<size_t>(parts), extra = count % static_cast<size_t>(parts);
  size_t offset = 0;
  for (size_t i = 0; i < blocks.size(); ++i) {
    size_t n = base + (i < extra ? 1 : 0);
    blocks[i] = Range{offset * elementSize, n * elementSize};
    offset += n;
  }
  return blocks;
}

std::vector<Range> uniformBlocks(size_t bytes, int parts) {
  std::vector<Range> blocks;
  for (int r = 0; r < parts; ++r) blocks.push_back(Range{bytes * static_cast<size_t>(r), bytes});
  return blocks;
}

std::vector<Range> blocksOf(const std::vector<size_t>& counts, size_t elementSize) {
  std::vector<Range> blocks;
  size_t offset = 0;
  for (size_t n : counts) {
    blocks.push_back(Range{offset * elementSize, n * elementSize});
    offset += n;
  }
  return blocks;
}

}  // namespace rdmacc
