// The immediate of a credit message: a zero-byte WRITE_WITH_IMM that hands
// consumed slots back to the peer that wrote them. One message returns up to
// 16 slots: bit 31 marks a credit, bits 16..30 name a group of 16 slots,
// bits 0..15 which slots of the group (slot = group x 16 + bit). A message
// carrying data has bit 31 clear and its slot in bits 0..15.
#pragma once

#include <bit>
#include <cstdint>
#include <vector>

namespace rdmacc::credits {

constexpr uint32_t kBit = 0x80000000u;
constexpr int kGroup = 16;
constexpr int kMaxSlots = 0x8000 * kGroup;

constexpr bool isCredit(uint32_t imm) noexcept {
  return (imm & kBit) != 0;
}

// Removes the first pending slot and every other slot of its group from
// `pending` and returns the immediate that hands them back. `pending` must
// not be empty; slots are in [0, kMaxSlots).
inline uint32_t take(std::vector<int>& pending) {
  const int group = pending.front() / kGroup;
  uint32_t mask = 0;
  std::erase_if(pending, [&](int slot) {
    if (slot / kGroup != group) return false;
    mask |= 1u << (slot % kGroup);
    return true;
  });
  return kBit | static_cast<uint32_t>(group) << 16 | mask;
}

// Calls f(slot) for every slot a credit immediate hands back.
template <typename F>
void forEach(uint32_t imm, F&& f) {
  const int base = static_cast<int>((imm & ~kBit) >> 16) * kGroup;
  for (uint32_t m = imm & 0xffffu; m != 0; m &= m - 1) f(base + std::countr_zero(m));
}

}  // namespace rdmacc::credits
