// The shared part of the collective suite (tests/device/collectives_*_test.cpp):
// the long-lived group, the dtypes, ops and sizes every case runs, a host
// buffer type, and the reference each result is compared with. Run the suite
// under `rdmacc-run -n N`: one group per world size runs every case (the VM
// is slow; groups are not cheap).
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "rdmacc/backend.hpp"

namespace rdmacc::suite {

extern std::shared_ptr<VerbsBackend> gBackend;
extern int R, N;  // this rank, the world size

extern const std::vector<DataType> kTypes;
extern const std::vector<ReduceOp> kOps;
extern const std::vector<size_t> kSizes;
constexpr double kFactor = 0.5;  // PreMulSum's

// RDMACC_TEST_REGISTER=1: every buffer of 4 KiB or more is registered with the
// backend while it lives, so the suite runs through the zero-copy path (the
// small ones would mostly time ibv_reg_mr).
extern const bool kRegister;

// A host buffer of one dtype holding small integer values, so that every
// reduction is exact in every type and order.
struct Buffer {
  DataType dtype;
  std::vector<uint8_t> bytes;
  Buffer(DataType t, size_t n) : dtype(t), bytes(n * elementSize(t) + 1) { enroll(); }
  Buffer(const Buffer& o) : dtype(o.dtype), bytes(o.bytes) { enroll(); }
  Buffer(Buffer&& o) noexcept
      : dtype(o.dtype),
        bytes(std::move(o.bytes)),
        registered(std::exchange(o.registered, nullptr)) {}
  Buffer& operator=(const Buffer& o) {
    if (this != &o) {
      release();
      dtype = o.dtype;
      bytes = o.bytes;
      enroll();
    }
    return *this;
  }
  Buffer& operator=(Buffer&& o) noexcept {
    if (this != &o) {
      release();
      dtype = o.dtype;
      bytes = std::move(o.bytes);
      registered = std::exchange(o.registered, nullptr);
    }
    return *this;
  }
  ~Buffer() { release(); }
  size_t numel() const { return (bytes.size() - 1) / elementSize(dtype); }
  Tensor tensor() { return Tensor{bytes.data(), numel(), dtype}; }
  Tensor slice(size_t first, size_t n) {
    return Tensor{bytes.data() + first * elementSize(dtype), n, dtype};
  }

  double get(size_t i) const {
    return getElement(Tensor{const_cast<uint8_t*>(bytes.data()), numel(), dtype}, i);
  }
  void set(size_t i, double v) { setElement(Tensor{bytes.data(), numel(), dtype}, i, v); }

 private:
  void* registered = nullptr;
  void enroll() {
    if (kRegister && gBackend && bytes.size() >= 4096) {  // the multi-chunk ones
      gBackend->registerMemory(bytes.data(), bytes.size());
      registered = bytes.data();
    }
  }
  void release() {
    if (registered != nullptr) gBackend->deregisterMemory(std::exchange(registered, nullptr));
  }
};

// The value rank r contributes at element i of case c.
double value(DataType t, ReduceOp op, int r, size_t i, int c);
// The element a reduction must produce, computed with plain double/int64 math.
double expected(DataType t, ReduceOp op, size_t i, int c);
Buffer contribution(DataType t, ReduceOp op, size_t n, int r, int c);
void expectReduced(const Buffer& got, ReduceOp op, size_t first, size_t n, int c,
                   const std::string& what);
void expectValues(const Buffer& got, DataType t, int fromRank, size_t first, size_t n, int c,
                  const std::string& what);
std::string name(DataType t, ReduceOp op, size_t n, Algorithm a);

}  // namespace rdmacc::suite
