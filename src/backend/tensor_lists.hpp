// A list of tensors laid end to end in one flat buffer and back: what the
// coalesced collectives do around a schedule over the flat buffer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "rdmacc/types.hpp"
#include "src/core/buffer.hpp"

namespace rdmacc {

// Copies the tensors into flat, one after another; returns the bytes written.
inline size_t packTensors(uint8_t* flat, const std::vector<Tensor>& tensors) noexcept {
  size_t at = 0;
  for (const auto& t : tensors) {
    copyBytes(flat + at, t.data, t.bytes());
    at += t.bytes();
  }
  return at;
}

// Copies flat back into the tensors, in the same order; returns the bytes read.
inline size_t unpackTensors(const uint8_t* flat, const std::vector<Tensor>& tensors) noexcept {
  size_t at = 0;
  for (const auto& t : tensors) {
    copyBytes(t.data, flat + at, t.bytes());
    at += t.bytes();
  }
  return at;
}

}  // namespace rdmacc
