// The collective suite's group, reference and main() (collectives.hpp).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

#include <fmt/format.h>

#include "tests/device/collectives.hpp"

namespace rdmacc::suite {

std::shared_ptr<VerbsBackend> gBackend;
int R = 0, N = 1;

const std::vector<DataType> kTypes = {DataType::Float32,  DataType::Float64, DataType::Float16,
                                      DataType::BFloat16, DataType::Int8,    DataType::UInt8,
                                      DataType::Int32,    DataType::Int64,   DataType::Bool};
const std::vector<ReduceOp> kOps = {ReduceOp::Sum, ReduceOp::Avg,  ReduceOp::Product,
                                    ReduceOp::Min, ReduceOp::Max,  ReduceOp::BAnd,
                                    ReduceOp::BOr, ReduceOp::BXor, ReduceOp::PreMulSum};
const std::vector<size_t> kSizes = {0, 1, 7, 4099};
const bool kRegister = std::getenv("RDMACC_TEST_REGISTER") != nullptr;

// The value rank r contributes at element i of case c.
double value(DataType t, ReduceOp op, int r, size_t i, int c) {
  uint64_t h = (static_cast<uint64_t>(r) + 1) * 0x9e3779b97f4a7c15ull ^
               (i + 1) * 0xbf58476d1ce4e5b9ull ^ static_cast<uint64_t>(c) * 0x94d049bb133111ebull;
  h ^= h >> 29;
  if (t == DataType::Bool) return static_cast<double>(h & 1);
  bool unsignedType = t == DataType::UInt8;
  if (op == ReduceOp::Product) {  // |product| <= 2^8: exact everywhere
    static const double kVals[] = {1, 2, -1, 1, -2, 1, 1, 2};
    double v = kVals[h % 8];
    return unsignedType ? std::abs(v) : v;
  }
  if (op == ReduceOp::BAnd || op == ReduceOp::BOr || op == ReduceOp::BXor)
    return static_cast<double>(h % 128);
  double v = static_cast<double>(h % 17) - 8;  // -8..8: sums of 8 ranks stay exact
  return unsignedType ? v + 8 : v;
}

// The element a reduction must produce, computed with plain double/int64 math.
double expected(DataType t, ReduceOp op, size_t i, int c) {
  auto contribution = [&](int r) {
    double v = value(t, op, r, i, c);
    if (op == ReduceOp::PreMulSum) {
      Buffer b(t, 1);
      b.set(0, v * kFactor);  // rounded (or truncated) to the type, as the backend does
      v = b.get(0);
    }
    return v;
  };
  double acc = contribution(0);
  for (int r = 1; r < N; ++r) {
    double v = contribution(r);
    int64_t a = static_cast<int64_t>(acc), b = static_cast<int64_t>(v);
    switch (op) {
      case ReduceOp::Sum:
      case ReduceOp::Avg:
      case ReduceOp::PreMulSum:
        acc = t == DataType::Bool ? double((a | b) != 0) : acc + v;
        break;
      case ReduceOp::Product:
        acc = t == DataType::Bool ? double(a && b) : acc * v;
        break;
      case ReduceOp::Min:
        acc = std::min(acc, v);
        break;
      case ReduceOp::Max:
        acc = std::max(acc, v);
        break;
      case ReduceOp::BAnd:
        acc = static_cast<double>(a & b);
        break;
      case ReduceOp::BOr:
        acc = static_cast<double>(a | b);
        break;
      case ReduceOp::BXor:
        acc = static_cast<double>(t == DataType::Bool ? (a != b) : (a ^ b));
        break;
    }
  }
  if (op == ReduceOp::Avg) {
    if (isFloatingPoint(t)) {
      Buffer b(t, 1);
      b.set(0, acc);
      acc = b.get(0);
      if (t == DataType::Float32) return static_cast<float>(acc) / static_cast<float>(N);
      b.set(0, acc / N);
      return b.get(0);
    }
    return static_cast<double>(static_cast<int64_t>(acc) / N);
  }
  return acc;
}

Buffer contribution(DataType t, ReduceOp op, size_t n, int r, int c) {
  Buffer b(t, n);
  for (size_t i = 0; i < n; ++i) b.set(i, value(t, op, r, i, c));
  return b;
}

void expectReduced(const Buffer& got, ReduceOp op, size_t first, size_t n, int c,
                   const std::string& what) {
  size_t bad = 0;
  for (size_t i = 0; i < n; ++i) {
    double want = expected(got.dtype, op, first + i, c);
    Buffer w(got.dtype, 1);
    w.set(0, want);
    if (got.get(i) != w.get(0)) {
      if (++bad <= 3)
        ADD_FAILURE() << what << ": element " << first + i << " is " << got.get(i) << ", want "
                      << w.get(0);
    }
  }
  EXPECT_EQ(bad, 0u) << what;
}

void expectValues(const Buffer& got, DataType t, int fromRank, size_t first, size_t n, int c,
                  const std::string& what) {
  size_t bad = 0;
  for (size_t i = 0; i < n; ++i) {
    Buffer w(t, 1);
    w.set(0, value(t, ReduceOp::Sum, fromRank, first + i, c));
    if (got.get(i) != w.get(0) && ++bad <= 3) {
      ADD_FAILURE() << what << ": element " << i << " is " << got.get(i) << ", want " << w.get(0);
    }
  }
  EXPECT_EQ(bad, 0u) << what;
}

std::string name(DataType t, ReduceOp op, size_t n, Algorithm a) {
  return fmt::format("{} {} n={} {} (rank {}/{})", toString(t), toString(op), n, toString(a), R, N);
}

}  // namespace rdmacc::suite

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  ::testing::InitGoogleTest(&argc, argv);
  try {
    // Small slots so that every size here crosses chunk and credit boundaries;
    // a run may ask for more slots (credits returned in several groups).
    rdmacc::VerbsBackend::Options options;
    options.groupName = "collectives";
    options.timeout = std::chrono::seconds(120);
    options.config = {{"RDMACC_SLOT_BYTES", "1024"}};
    if (std::getenv("RDMACC_SLOTS_PER_PEER") == nullptr) {
      options.config["RDMACC_SLOTS_PER_PEER"] = "4";
    }
    rdmacc::suite::gBackend = rdmacc::initFromEnvironment(options);
    rdmacc::suite::R = rdmacc::suite::gBackend->getRank();
    rdmacc::suite::N = rdmacc::suite::gBackend->getSize();
  } catch (const std::exception& e) {
    fmt::print(stderr, "cannot form the group: {}\n", e.what());
    return 1;
  }
  int rc = RUN_ALL_TESTS();
  try {
    rdmacc::suite::gBackend->barrier()->wait();  // nobody tears down while others still talk
  } catch (const std::exception& e) {
    fmt::print(stderr, "final barrier: {}\n", e.what());
    rc = 1;
  }
  rdmacc::suite::gBackend.reset();
  return rc;
}
