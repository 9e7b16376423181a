// The validation of everything a peer writes into this rank (src/transport/wire.hpp):
// a table of hostile completions and headers, each rejected with a message
// that says what was sent; and the slot ledger's ownership rules.
#include "src/transport/wire.hpp"

#include <gtest/gtest.h>

#include <string>

#include "src/transport/credits.hpp"

namespace rdmacc::wire {
namespace {

constexpr Limits kLimits{.slotsPerPeer = 16, .slotBytes = 4096};

Completion message(int slot, uint32_t bytes) {
  return Completion{.rdmaWriteWithImm = true,
                    .withImm = true,
                    .imm = static_cast<uint32_t>(slot),
                    .byteLen = bytes};
}

Completion credit(std::vector<int> slots) {
  return Completion{.rdmaWriteWithImm = true, .withImm = true, .imm = credits::take(slots)};
}

// The ledger as it is right after the group formed: every peer slot
// writable, none of ours held.
SlotLedger fresh() {
  return SlotLedger(kLimits.slotsPerPeer);
}

std::string rejection(const Completion& c, const SlotLedger& ledger) {
  Arrival a;
  auto v = checkCompletion(c, kLimits, ledger, a);
  return v ? v->what : "";
}

std::string rejection(const Header& h, uint32_t byteLen, const SlotLedger& ledger) {
  auto v = checkHeader(h, byteLen, kLimits, ledger);
  return v ? v->what : "";
}

TEST(Wire, WellFormedMessagesAndCreditsAreAccepted) {
  SlotLedger ledger = fresh();
  Arrival a;
  EXPECT_FALSE(checkCompletion(message(3, 64 + 100), kLimits, ledger, a));
  EXPECT_FALSE(a.credit);
  EXPECT_EQ(a.slot, 3);
  Header h{.kind = MessageKind::Collective, .payload = 100};
  EXPECT_EQ(rejection(h, 64 + 100, ledger), "");
  h.flags = kDirect;  // the payload went ahead to the advertised destination
  EXPECT_EQ(rejection(h, 64, ledger), "");
  ledger.written(5);
  EXPECT_FALSE(checkCompletion(credit({5}), kLimits, ledger, a));
  EXPECT_TRUE(a.credit);
  h = Header{.kind = MessageKind::PointToPoint, .payload = 0, .credits = uint64_t{1} << 5};
  EXPECT_EQ(rejection(h, 64, ledger), "");
}

struct HostileCompletion {
  const char* name;
  Completion completion;
  const char* says;  // a part of the error text
};

TEST(Wire, HostileCompletionsAreRejected) {
  const HostileCompletion table[] = {
      {"a send, not a write",
       {.rdmaWriteWithImm = false, .withImm = true, .imm = 1},
       "not an RDMA write"},
      {"no immediate",
       {.rdmaWriteWithImm = true, .withImm = false, .imm = 1, .byteLen = 64},
       "not an RDMA write"},
      {"slot past the end", message(16, 64), "slot 16 of 16"},
      {"slot 0xffff", message(0xffff, 64), "slot 65535 of 16"},
      {"reserved immediate bits", message(0x10003, 64), "reserved bits"},
      {"shorter than a header", message(2, 63), "63-byte write"},
      {"longer than a slot", message(2, 4097), "4097-byte write"},
      {"zero bytes", message(2, 0), "0-byte write"},
      {"credit with data",
       {.rdmaWriteWithImm = true, .withImm = true, .imm = credits::kBit | 1u, .byteLen = 8},
       "carried 8 bytes"},
      {"credit for no slot",
       {.rdmaWriteWithImm = true, .withImm = true, .imm = credits::kBit},
       "no slot"},
      {"credit past the end",
       {.rdmaWriteWithImm = true, .withImm = true, .imm = credits::kBit | 1u << 16 | 1u},
       "slot 16 of 16"},
      {"credit for the last group",
       {.rdmaWriteWithImm = true, .withImm = true, .imm = 0xffffffffu},
       "of 16"},
      {"credit never written", credit({4}), "credit returned twice"},
  };
  for (const auto& row : table) {
    std::string what = rejection(row.completion, fresh());
    EXPECT_NE(what.find(row.says), std::string::npos) << row.name << ": '" << what << "'";
  }
}

TEST(Wire, AMessageIntoAHeldSlotIsRejected) {
  SlotLedger ledger = fresh();
  ledger.arrived(7);
  EXPECT_NE(rejection(message(7, 64), ledger).find("still holds an earlier message"),
            std::string::npos);
  // Consumed, but the credit has not gone back yet: still ours.
  EXPECT_NE(rejection(message(7, 64), ledger), "");
  ledger.handedBack(7);
  EXPECT_EQ(rejection(message(7, 64), ledger), "");
}

TEST(Wire, ACreditReturnedTwiceIsRejected) {
  SlotLedger ledger = fresh();
  ledger.written(2);
  EXPECT_EQ(rejection(credit({2}), ledger), "");
  ledger.credited(2);
  EXPECT_NE(rejection(credit({2}), ledger).find("credit returned twice"), std::string::npos);
  // The same through a header's piggybacked mask.
  Header h{.kind = MessageKind::Collective, .credits = uint64_t{1} << 2};
  EXPECT_NE(rejection(h, 64, ledger).find("credit returned twice"), std::string::npos);
}

struct HostileHeader {
  const char* name;
  Header header;
  uint32_t byteLen;
  const char* says;
};

TEST(Wire, HostileHeadersAreRejected) {
  SlotLedger ledger = fresh();
  const HostileHeader table[] = {
      {"wrong magic", {.magic = 0x1234}, 64, "magic 0x1234"},
      {"kind 0", {.kind = static_cast<MessageKind>(0)}, 64, "unknown kind 0"},
      {"kind 7", {.kind = static_cast<MessageKind>(7)}, 64, "unknown kind 7"},
      {"leave with payload", {.kind = MessageKind::Leave, .payload = 8}, 72, "no payload"},
      {"unknown flag", {.flags = 2}, 64, "flags 0x2"},
      {"direct p2p", {.kind = MessageKind::PointToPoint, .flags = kDirect}, 64, "flags 0x1"},
      {"payload past the slot", {.payload = 4096 - 64 + 1}, 4096, "more than a slot's 4032"},
      {"huge payload", {.payload = 0xffffffffu}, 4096, "more than a slot"},
      {"payload longer than the write", {.payload = 100}, 64, "64-byte write"},
      {"payload shorter than the write", {.payload = 10}, 64 + 100, "164-byte write"},
      {"direct with bytes in the slot",
       {.flags = kDirect, .payload = 100},
       64 + 100,
       "164-byte write"},
      {"advert with payload",
       {.kind = MessageKind::Advert, .payload = 8, .length = 8},
       72,
       "8 payload bytes"},
      {"advert of nothing", {.kind = MessageKind::Advert, .length = 0}, 64, "advert"},
      {"advert wrapping around",
       {.kind = MessageKind::Advert, .addr = ~uint64_t{0} - 2, .length = 16},
       64,
       "advert"},
      {"credit past the end", {.credits = uint64_t{1} << 40}, 64, "slot 40 of 16"},
      {"credit never written", {.credits = 1}, 64, "credit returned twice"},
  };
  for (const auto& row : table) {
    std::string what = rejection(row.header, row.byteLen, ledger);
    EXPECT_NE(what.find(row.says), std::string::npos) << row.name << ": '" << what << "'";
  }
}

TEST(Wire, PointToPointChunksCarryExactlyWhatTheReceiveExpects) {
  const size_t chunk = 4032;
  Header h{.kind = MessageKind::PointToPoint, .payload = 8};
  EXPECT_FALSE(checkPointToPointChunk(h, 8, 0, chunk));
  // A full chunk announced to an 8-byte receive (the heap overflow of old).
  h.payload = 4032;
  auto v = checkPointToPointChunk(h, 8, 0, chunk);
  ASSERT_TRUE(v);
  EXPECT_NE(v->what.find("carrying 4032 bytes where the receive expects 8"), std::string::npos)
      << v->what;
  // A short chunk in the middle would leave bytes never written.
  h.payload = 100;
  EXPECT_TRUE(checkPointToPointChunk(h, 10000, 0, chunk));
  h.payload = 10000 - 2 * 4032;
  EXPECT_FALSE(checkPointToPointChunk(h, 10000, 2 * 4032, chunk));
  h.payload = 0;
  EXPECT_FALSE(checkPointToPointChunk(h, 0, 0, chunk));
  h.payload = 1;
  EXPECT_TRUE(checkPointToPointChunk(h, 0, 0, chunk));
}

TEST(Wire, LedgerCoversSlotsBeyondOneWord) {
  SlotLedger ledger(70);
  for (int s = 0; s < 70; ++s) {
    EXPECT_TRUE(ledger.sendable(s));
    EXPECT_FALSE(ledger.held(s));
  }
  ledger.written(69);
  ledger.arrived(65);
  EXPECT_FALSE(ledger.sendable(69));
  EXPECT_TRUE(ledger.held(65));
  EXPECT_TRUE(ledger.sendable(5));
  EXPECT_FALSE(ledger.held(1));
}

}  // namespace
}  // namespace rdmacc::wire
