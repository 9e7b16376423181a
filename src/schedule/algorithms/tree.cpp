#include <algorithm>

#include "src/schedule/algorithms/algorithms.hpp"

namespace rdmacc::algorithms {
namespace {

int virtualRank(int rank, int size, int root) {
  return (rank - root + size) % size;
}
int realRank(int v, int size, int root) {
  return (v + root) % size;
}

// Receive from `parent` (unless root) and forward to `children` as it arrives.
Schedule forwardDown(int parent, const std::vector<int>& children, size_t bytes) {
  Step step;
  std::vector<int> gates;
  if (parent >= 0) {
    step.recvs.push_back(RecvSpec{parent, Range{0, bytes}, Combine::Copy});
    gates.push_back(0);
  }
  for (int c : children) step.sends.push_back(SendSpec{c, Range{0, bytes}, gates});
  return Schedule{std::move(step)};
}

}  // namespace

int binomialParent(int rank, int size, int root) {
  int v = virtualRank(rank, size, root);
  if (v == 0) return -1;
  return realRank(v & (v - 1), size, root);  // clear the lowest set bit
}

std::vector<int> binomialChildren(int rank, int size, int root) {
  int v = virtualRank(rank, size, root);
  std::vector<int> children;
  for (int mask = 1; mask < size; mask <<= 1) {
    if (v & mask) break;
    if (v + mask < size) children.push_back(realRank(v + mask, size, root));
  }
  std::reverse(children.begin(), children.end());  // the largest subtree first
  return children;
}

Schedule treeBroadcast(int rank, int size, int root, size_t bytes) {
  if (size == 1) return {};
  return forwardDown(binomialParent(rank, size, root), binomialChildren(rank, size, root), bytes);
}

Schedule chainBroadcast(int rank, int size, int root, size_t bytes) {
  if (size == 1) return {};
  int v = virtualRank(rank, size, root);
  int parent = v == 0 ? -1 : realRank(v - 1, size, root);
  std::vector<int> children;
  if (v + 1 < size) children.push_back(realRank(v + 1, size, root));
  return forwardDown(parent, children, bytes);
}

Schedule treeReduce(int rank, int size, int root, size_t bytes) {
  if (size == 1) return {};
  Step step;
  std::vector<int> gates;
  for (int c : binomialChildren(rank, size, root)) {
    gates.push_back(static_cast<int>(step.recvs.size()));
    step.recvs.push_back(RecvSpec{c, Range{0, bytes}, Combine::Reduce});
  }
  int parent = binomialParent(rank, size, root);
  if (parent >= 0) step.sends.push_back(SendSpec{parent, Range{0, bytes}, gates});
  return Schedule{std::move(step)};
}

Schedule treeAllreduce(int rank, int size, size_t bytes, bool finalize) {
  Schedule out = treeReduce(rank, size, 0, bytes);
  Schedule down = treeBroadcast(rank, size, 0, bytes);
  if (down.empty()) down.push_back(Step{});
  if (finalize && rank == 0) down.front().finalize.push_back(Range{0, bytes});
  for (auto& s : down) out.push_back(std::move(s));
  return out;
}

}  // namespace rdmacc::algorithms
