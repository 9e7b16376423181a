#include <gtest/gtest.h>

#include "src/transport/rdma/handshake.hpp"

namespace rdmacc::handshake {
namespace {

constexpr std::string_view kSecret = "0123456789abcdef0123456789abcdef";
constexpr uint32_t kQpn = 0x1234;

// Fields of rank 5's request to rank 2, not sealed.
Hello unsealed() {
  return Hello{.qpIndex = 1, .rank = 5, .targetRank = 2, .worldSize = 8, .activeMtu = 4096};
}

Hello sample() {
  Hello h = unsealed();
  seal(h, kSecret, Direction::Request, kQpn);
  return h;
}

Expectation expectation() {
  return Expectation{.myRank = 2,
                     .worldSize = 8,
                     .secret = kSecret,
                     .direction = Direction::Request,
                     .senderQpn = kQpn,
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
  EXPECT_EQ(back->proof, sample().proof);
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
  EXPECT_EQ(with([](Hello& h) { h.proof[0] ^= 1; }), RejectReason::BadToken);
  EXPECT_EQ(with([](Hello& h) { h.version = 99; }), RejectReason::BadVersion);
  EXPECT_EQ(with([](Hello& h) { h.worldSize = 4; }), RejectReason::WorldSizeMismatch);
  EXPECT_EQ(with([](Hello& h) { h.targetRank = 3; }), RejectReason::WrongTarget);
  EXPECT_EQ(with([](Hello& h) { h.rank = 1; }),
            RejectReason::BadRank);  // lower ranks are connected to, not from
  EXPECT_EQ(with([](Hello& h) { h.rank = 8; }), RejectReason::BadRank);
  EXPECT_EQ(with([](Hello& h) { h.rank = 2; }), RejectReason::BadRank);
  EXPECT_EQ(with([](Hello& h) { h.qpIndex = 2; }), RejectReason::BadQpIndex);
}

// The proof binds every field, the direction and the sender's queue pair:
// a hello seen on the fabric (connect requests are not encrypted) cannot be
// replayed from another queue pair, as a reply, to another rank or with
// another field changed; without the secret none can be made.
TEST(Handshake, AProofIsBoundToItsFieldsDirectionAndQueuePair) {
  const Hello seen = sample();
  auto replayed = [&](auto change) {
    Expectation e = expectation();
    Hello h = seen;
    change(h, e);
    return validate(h, e);
  };
  EXPECT_EQ(replayed([](Hello&, Expectation& e) { e.senderQpn = kQpn + 1; }),
            RejectReason::BadToken);
  EXPECT_EQ(replayed([](Hello&, Expectation& e) { e.direction = Direction::Reply; }),
            RejectReason::BadToken);
  EXPECT_EQ(replayed([](Hello&, Expectation& e) { e.secret = "another group's secret"; }),
            RejectReason::BadToken);
  EXPECT_EQ(replayed([](Hello& h, Expectation&) { h.activeMtu = 1024; }), RejectReason::BadToken);
  EXPECT_EQ(replayed([](Hello& h, Expectation&) { h.rank = 6; }), RejectReason::BadToken);
  EXPECT_EQ(replayed([](Hello& h, Expectation&) { h.qpIndex = 0; }), RejectReason::BadToken);
  EXPECT_EQ(replayed([](Hello& h, Expectation& e) {
              h.targetRank = 3;
              e.myRank = 3;
              e.minPeer = 4;
            }),
            RejectReason::BadToken);
  // A proof made with the wrong secret fails; resealing with the right one passes.
  Hello forged = unsealed();
  seal(forged, "guess", Direction::Request, kQpn);
  EXPECT_EQ(validate(forged, expectation()), RejectReason::BadToken);
  seal(forged, kSecret, Direction::Request, kQpn);
  EXPECT_FALSE(validate(forged, expectation()));
  // The secret itself is nowhere in the bytes on the wire.
  const auto bytes = encode(seen);
  const std::string wire(bytes.begin(), bytes.end());
  EXPECT_EQ(wire.find(kSecret.substr(0, 8)), std::string::npos);
}

// A hello carries its sender's slots for the receiver, whether it connects
// on first use, and (eager) the one-shot board it offers: they round-trip,
// the proof covers them, and a receiver that connects the other way or has
// other slots says so.
TEST(Handshake, HellosCarryTheSlotsTheModeAndTheBoard) {
  Hello h = unsealed();
  h.slotsPerPeer = 16;
  h.slotBytes = 65536;
  h.slotBase = 0x7f0012345000;
  h.slotRkey = 0xabcdef;
  h.lazy = true;
  seal(h, kSecret, Direction::Request, kQpn);
  const auto bytes = encode(h);
  ASSERT_EQ(bytes.size(), 56u);  // all of an IB CM REQ's private data
  const auto back = decodeHello(bytes);
  ASSERT_TRUE(back);
  EXPECT_EQ(back->slotsPerPeer, 16u);
  EXPECT_EQ(back->slotBytes, 65536u);
  EXPECT_EQ(back->slotBase, 0x7f0012345000u);
  EXPECT_EQ(back->slotRkey, 0xabcdefu);
  EXPECT_TRUE(back->lazy);
  EXPECT_EQ(back->qpIndex, 1u);
  Expectation lazy = expectation();
  lazy.lazy = true;
  lazy.slotsPerPeer = 16;
  lazy.slotBytes = 65536;
  EXPECT_FALSE(validate(*back, lazy));
  Hello moved = *back;
  moved.slotBase += 4096;  // a relay pointing our writes elsewhere
  EXPECT_EQ(validate(moved, lazy), RejectReason::BadToken);
  Expectation eager = lazy;
  eager.lazy = false;
  EXPECT_EQ(validate(*back, eager), RejectReason::ConnectModeMismatch);
  lazy.slotBytes = 32768;
  EXPECT_EQ(validate(*back, lazy), RejectReason::SlotMismatch);

  // Eager: the board's size shares the mode's byte, and the proof covers it.
  Hello board = unsealed();
  board.boardBytes = kMaxBoardBytes;
  seal(board, kSecret, Direction::Reply, kQpn);
  const auto boardBack = decodeHello(encode(board));
  ASSERT_TRUE(boardBack);
  EXPECT_FALSE(boardBack->lazy);
  EXPECT_EQ(boardBack->boardBytes, kMaxBoardBytes);
  Expectation reply = expectation();
  reply.direction = Direction::Reply;
  EXPECT_FALSE(validate(*boardBack, reply));
  Hello bigger = *boardBack;
  bigger.boardBytes = 8;  // a relay shrinking the entries we write
  EXPECT_EQ(validate(bigger, reply), RejectReason::BadToken);
}

TEST(Handshake, RejectRoundTrips) {
  for (auto r : {RejectReason::Malformed, RejectReason::BadToken, RejectReason::Duplicate,
                 RejectReason::BadQpIndex, RejectReason::ConnectModeMismatch,
                 RejectReason::SlotMismatch, RejectReason::Crossed}) {
    auto bytes = encodeReject(r);
    EXPECT_EQ(decodeReject(bytes), r);
    EXPECT_STRNE(toString(r), "unknown reason");
  }
  auto hello = encode(sample());
  EXPECT_FALSE(decodeReject(hello));
}

}  // namespace
}  // namespace rdmacc::handshake
