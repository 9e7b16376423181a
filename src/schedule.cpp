#include "src/schedule.hpp"

namespace rdmacc {

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
