#include <gtest/gtest.h>

#include "src/handshake.hpp"

namespace rdmacc::handshake {
namespace {

Hello sample() {
  return Hello{.qpIndex = 1,
               .rank = 5,
               .targetRank = 2,
               .worldSize = 8,
               .token = 0x0123456789abcdefull,
               .activeMtu = 4096};
}

Expectation expectation() {
  return Expectation{.myRank = 2,
                     .worldSize = 8,
                     .token = 0x0123456789abcdefull,
                     .qpsPerPeer = 2,
                     .minPeer = 3,
                     .maxPeer = 7};
}

TEST(Handshake, HelloRoundTripsAndToleratesPadding) {
  auto bytes = encode(sample());
  std::vector<uint8_t> padded(bytes.begin(), bytes.end());
  padded.resize(56, 0);  // IB CM pads REQ private data
  auto back = decodeHello(padded);
  ASSERT_TRUE(back);
  EXPECT_EQ(back->rank, 5u);
  EXPECT_EQ(back->targetRank, 2u);
  EXPECT_EQ(back->token, 0x0123456789abcdefull);
  EXPECT_EQ(back->activeMtu, 4096u);
  EXPECT_EQ(back->qpIndex, 1u);
}

TEST(Handshake, ForeignOrShortDataIsNotAHello) {
  auto bytes = encode(sample());
  EXPECT_FALSE(decodeHello(std::span(bytes.data(), bytes.size() - 1)));
  bytes[0] ^= 1;
  EXPECT_FALSE(decodeHello(bytes));
  EXPECT_FALSE(decodeHello({}));
}

TEST(Handshake, ValidationNamesEachProblem) {
  EXPECT_FALSE(validate(sample(), expectation()));
  auto with = [](auto change) {
    Hello h = sample();
    change(h);
    return validate(h, expectation());
  };
  EXPECT_EQ(with([](Hello& h) { h.token ^= 1; }), RejectReason::BadToken);
  EXPECT_EQ(with([](Hello& h) { h.version = 99; }), RejectReason::BadVersion);
  EXPECT_EQ(with([](Hello& h) { h.worldSize = 4; }), RejectReason::WorldSizeMismatch);
  EXPECT_EQ(with([](Hello& h) { h.targetRank = 3; }), RejectReason::WrongTarget);
  EXPECT_EQ(with([](Hello& h) { h.rank = 1; }),
            RejectReason::BadRank);  // lower ranks are connected to, not from
  EXPECT_EQ(with([](Hello& h) { h.rank = 8; }), RejectReason::BadRank);
  EXPECT_EQ(with([](Hello& h) { h.rank = 2; }), RejectReason::BadRank);
  EXPECT_EQ(with([](Hello& h) { h.qpIndex = 2; }), RejectReason::BadQpIndex);
}

TEST(Handshake, RejectRoundTrips) {
  for (auto r : {RejectReason::Malformed, RejectReason::BadToken, RejectReason::Duplicate,
                 RejectReason::BadQpIndex}) {
    auto bytes = encodeReject(r);
    EXPECT_EQ(decodeReject(bytes), r);
    EXPECT_STRNE(toString(r), "unknown reason");
  }
  auto hello = encode(sample());
  EXPECT_FALSE(decodeReject(hello));
}

}  // namespace
}  // namespace rdmacc::handshake
