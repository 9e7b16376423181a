// The RDMA board's entry format: what a reader accepts from the words a
// peer's write placed, in any order and partly, and what it refuses.
#include "src/transport/board_words.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>
#include <vector>

namespace rdmacc {
namespace {

using board_words::decode;
using board_words::encode;
using board_words::entryWords;
using board_words::State;

std::vector<uint64_t> entry(uint32_t flag, uint64_t sequence, uint64_t check,
                            const std::vector<uint8_t>& data) {
  std::vector<uint64_t> words(entryWords(data.size()));
  encode(words.data(), flag, sequence, check, data.data(), data.size());
  return words;
}

TEST(BoardWords, RoundTripsEverySizeUpToAnEntry) {
  for (size_t bytes = 0; bytes <= 37; ++bytes) {
    std::vector<uint8_t> data(bytes);
    std::iota(data.begin(), data.end(), uint8_t{1});
    const auto words = entry(7, 0x1122334455667788, 0xfeedfacecafebeef, data);
    std::vector<uint8_t> out(bytes + 4, 0xee);
    const auto r = decode(words.data(), bytes, 7, 5, out.data());
    ASSERT_EQ(r.state, State::Complete) << bytes;
    EXPECT_EQ(r.head.sequence, 0x1122334455667788u);
    EXPECT_EQ(r.head.check, 0xfeedfacecafebeefu);
    EXPECT_EQ(r.head.bytes, bytes);
    EXPECT_TRUE(std::equal(data.begin(), data.end(), out.begin())) << bytes;
    // Nothing past the payload is written, even in the last word's padding.
    EXPECT_EQ(out[bytes], 0xee) << bytes;
  }
}

TEST(BoardWords, IsPendingUntilEveryWordLandedInAnyOrder) {
  const std::vector<uint8_t> data{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11};
  const auto previous = entry(3, 40, 99, data);
  const auto next = entry(5, 42, 99, data);
  std::vector<size_t> order(next.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::mt19937 random(11);
  std::vector<uint8_t> out(data.size());
  for (int trial = 0; trial < 50; ++trial) {
    std::shuffle(order.begin(), order.end(), random);
    auto words = previous;
    for (size_t i = 0; i < order.size(); ++i) {
      EXPECT_EQ(decode(words.data(), data.size(), 5, 3, out.data()).state, State::Pending);
      words[order[i]] = next[order[i]];
    }
    const auto r = decode(words.data(), data.size(), 5, 3, out.data());
    ASSERT_EQ(r.state, State::Complete);
    EXPECT_EQ(r.head.sequence, 42u);
    EXPECT_EQ(out, data);
  }
}

TEST(BoardWords, AFreshRegionIsPendingForTheFirstOperation) {
  std::vector<uint64_t> zeros(entryWords(8), 0);
  std::vector<uint8_t> out(8);
  EXPECT_EQ(decode(zeros.data(), 8, 1, 0, out.data()).state, State::Pending);
}

TEST(BoardWords, AWordWithAnyOtherFlagIsCorruptAndNamed) {
  const std::vector<uint8_t> data(8, 0x5a);
  auto words = entry(9, 1, 2, data);
  words[6] = board_words::word(0xdead, 0);  // a forged payload word
  std::vector<uint8_t> out(8);
  const auto r = decode(words.data(), 8, 9, 7, out.data());
  ASSERT_EQ(r.state, State::Corrupt);
  EXPECT_NE(r.problem.find("word 6"), std::string::npos) << r.problem;
  EXPECT_NE(r.problem.find("0xdead"), std::string::npos) << r.problem;
  // A post from ahead (an entry two operations on) is as foreign.
  const auto ahead = entry(11, 3, 2, data);
  EXPECT_EQ(decode(ahead.data(), 8, 9, 7, out.data()).state, State::Corrupt);
}

TEST(BoardWords, AForgedSizeIsReportedNotUsed) {
  // The size field says 1 TiB: the reader decodes only the bytes it expects
  // and reports the peer's claim for the caller to refuse.
  const std::vector<uint8_t> data(8, 1);
  auto words = entry(4, 1, 2, data);
  words[4] = board_words::word(4, 0);
  words[5] = board_words::word(4, 0x100);
  std::vector<uint8_t> out(8);
  const auto r = decode(words.data(), 8, 4, 2, out.data());
  ASSERT_EQ(r.state, State::Complete);
  EXPECT_EQ(r.head.bytes, uint64_t{1} << 40);
}

TEST(BoardWords, MaxPayloadFitsTheEntry) {
  EXPECT_EQ(board_words::maxPayload(256), 104u);
  EXPECT_LE(8 * entryWords(board_words::maxPayload(256)), 256u);
  EXPECT_EQ(board_words::maxPayload(48), 0u);
  EXPECT_EQ(board_words::maxPayload(0), 0u);
}

}  // namespace
}  // namespace rdmacc
