// Caller arguments checked before anything is sized from them (src/backend/arguments).
#include "src/backend/arguments.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <string>

#include "rdmacc/error.hpp"

namespace rdmacc {
namespace {

std::string refusal(const std::vector<int64_t>& splits, size_t numel, int ranks) {
  try {
    splitCounts(splits, numel, ranks, "input");
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::InvalidArgument);
    return e.what();
  }
  return "";
}

TEST(Arguments, SplitSizesThatWrapAroundAreRefused) {
  // 4 x (2^62 + 1) wraps a 64-bit sum to 4: accepted by the sum check of old,
  // which then let alltoall_base move 2^62 bytes.
  const int64_t quarter = (int64_t{1} << 62) + 1;
  std::string what = refusal({quarter, quarter, quarter, quarter}, 4, 4);
  EXPECT_NE(what.find("add up to more than the 4 elements"), std::string::npos) << what;
  what = refusal({INT64_MAX, INT64_MAX, 2, 0}, 4, 4);
  EXPECT_NE(what.find("more than the 4 elements"), std::string::npos) << what;
}

TEST(Arguments, SplitSizesAreCheckedOnePerRankAndNonNegative) {
  EXPECT_NE(refusal({1, 1, 1}, 3, 4).find("3 input split sizes for 4 ranks"), std::string::npos);
  EXPECT_NE(refusal({2, -1, 1, 2}, 4, 4).find("split size 1 is negative"), std::string::npos);
  EXPECT_NE(refusal({1, 1, 1, 0}, 4, 4).find("add up to 3, but the tensor has 4"),
            std::string::npos);
  EXPECT_NE(refusal({}, 5, 4).find("not divisible by 4"), std::string::npos);
  EXPECT_EQ(splitCounts({1, 0, 2, 1}, 4, 4, "input"), (std::vector<size_t>{1, 0, 2, 1}));
  EXPECT_EQ(splitCounts({}, 8, 4, "input"), (std::vector<size_t>{2, 2, 2, 2}));
}

TEST(Arguments, GroupsBeyondTheWorkRequestPeerFieldAreRefused) {
  checkGroup(0, 1);
  checkGroup(65535, kMaxWorldSize);
  for (auto [rank, size] : {std::pair{0, 0}, {0, 65537}, {70000, 70000}, {-1, 4}, {4, 4}}) {
    try {
      checkGroup(rank, size);
      ADD_FAILURE() << "accepted rank " << rank << " of " << size;
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::InvalidArgument);
    }
  }
}

TEST(Arguments, TensorsWhoseByteSizeWrapsAreRefused) {
  float x = 0;
  Tensor t{.data = &x, .numel = (SIZE_MAX / 4) + 1, .dtype = DataType::Float32};
  try {
    checkTensor(t, "allreduce", "the tensor");
    FAIL() << "accepted a tensor of more than SIZE_MAX bytes";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("more bytes than memory can hold"), std::string::npos);
  }
  t.numel = 0;
  t.data = nullptr;
  checkTensor(t, "allreduce", "the tensor");
}

}  // namespace
}  // namespace rdmacc
