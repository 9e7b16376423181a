// The engine's wire format and the validation of everything a peer sends:
// the immediate of a WRITE_WITH_IMM, the completion that carried it, and the
// message header the peer wrote into one of our slots. Pure (no verbs, no
// engine state beyond the SlotLedger it is given): host-tested with a table of
// hostile inputs and fuzzed (tests/fuzz/wire_fuzz.cpp).
//
// A peer is buggy, malicious or a different build until its bytes are checked:
// nothing it sent is used before check() accepted it, and every rejection says
// what the peer sent.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace rdmacc::wire {

constexpr uint32_t kMagic = 0x52434d47;  // "RCMG"

// Advert: the sender of a collective receive may write it straight into the
// receiver's registered destination (addr/rkey/length in the header) instead
// of its slots; each such chunk still comes with a header (flag kDirect).
// Stuck: the sender's collective timed out, or it answers one that did; the
// payload lists the ranks it waits for ("2,5"; src/engine/blame.hpp).
enum class MessageKind : uint8_t {
  Collective = 1,
  PointToPoint = 2,
  Abort = 3,
  Advert = 4,
  Stuck = 5,
  // On a connection groups share (src/transport/link.hpp): the sender's
  // group on this channel is gone, as a group's own connection closing
  // would tell. No payload; never reaches an engine.
  Leave = 6,
};
constexpr uint16_t kDirect = 1;  // Header::flags: the payload is already at its destination
constexpr uint16_t kKnownFlags = kDirect;

// At the start of every slot. The receiver checks it against what it expects,
// which catches ranks that call collectives in a different order or with
// different sizes.
struct Header {
  uint32_t magic = kMagic;
  MessageKind kind = MessageKind::Collective;
  uint8_t opType = 0;
  uint16_t flags = 0;
  uint32_t sequence = 0;  // collective sequence number, or the p2p tag
  uint32_t step = 0;      // collective step, or the p2p chunk index
  uint32_t payload = 0;   // bytes after the header
  uint32_t chunk = 0;     // collective: the message's index within its step's transfer
  uint64_t check = 0;     // collective: the op's check value; p2p: message bytes
  // Credits riding along: bit i hands the receiver its slot i in our region
  // back, saving a credit message (slots 0..63; higher ones go explicitly).
  uint64_t credits = 0;
  // Advert: where the receive of (sequence, step) from this peer may be written.
  uint64_t addr = 0;
  uint32_t rkey = 0;
  uint32_t length = 0;
  // The group the message belongs to on a connection the groups of a
  // process pair share (src/transport/link.hpp); 0 on a group's own.
  uint32_t channel = 0;
  // There too: the tag of the sender's group's name (Link::groupTag), so a
  // channel two groups both took is caught, not mixed up; 0 on a group's own.
  uint32_t group = 0;
};
static_assert(sizeof(Header) == 64);
constexpr size_t kHeaderBytes = 64;  // payload stays 64-byte aligned

// "allreduce #12 step 3 (check 0x..., 4096 bytes)", for traces and errors.
std::string describe(const Header& h);

// Who owns each slot of one peer's traffic, as seen by this rank:
// - `sendable`: the peer's slots (in its region) this rank may write now. A
//   credit hands one back; handing back a slot this rank may already write
//   (twice, or never written) is a protocol violation.
// - `held`: this rank's slots for the peer (in our region) that hold a message
//   or wait for their credit to go back. A write into a held slot would
//   overwrite a message still in use: a protocol violation.
class SlotLedger {
 public:
  explicit SlotLedger(int slots = 0);
  int slots() const noexcept { return slots_; }

  bool sendable(int slot) const { return bit(sendable_, slot); }
  bool held(int slot) const { return bit(held_, slot); }
  // This rank wrote into the peer's slot: it is the peer's until a credit.
  void written(int slot) { set(sendable_, slot, false); }
  // A credit from the peer (accepted by check()): the slot may be written again.
  void credited(int slot) { set(sendable_, slot, true); }
  // A message arrived in our slot (accepted by check()).
  void arrived(int slot) { set(held_, slot, true); }
  // The slot's credit goes back to the peer: it may write the slot again.
  void handedBack(int slot) { set(held_, slot, false); }

 private:
  static bool bit(const std::vector<uint64_t>& v, int slot) {
    return (v[static_cast<size_t>(slot) / 64] >> (static_cast<unsigned>(slot) % 64)) & 1u;
  }
  static void set(std::vector<uint64_t>& v, int slot, bool on) {
    uint64_t m = uint64_t{1} << (static_cast<unsigned>(slot) % 64);
    auto& w = v[static_cast<size_t>(slot) / 64];
    w = on ? (w | m) : (w & ~m);
  }
  int slots_ = 0;
  std::vector<uint64_t> sendable_;
  std::vector<uint64_t> held_;
};

struct Limits {
  int slotsPerPeer = 0;
  size_t slotBytes = 0;  // header + the largest payload
};

// What the completion queue reported for a receive (verbs-free).
struct Completion {
  bool rdmaWriteWithImm = false;  // opcode IBV_WC_RECV_RDMA_WITH_IMM
  bool withImm = false;           // IBV_WC_WITH_IMM in wc_flags
  uint32_t imm = 0;               // host order
  uint32_t byteLen = 0;           // bytes the write carried
};

// An accepted arrival: a credit message (credits::forEach(imm) names the
// slots it hands back) or a message in `slot` whose header is checked next
// (checkHeader).
struct Arrival {
  bool credit = false;
  int slot = -1;  // message: our slot it was written into
};

// A violation: what the peer sent and why it cannot be right.
struct Violation {
  std::string what;
};

// The completion and its immediate. Accepting it does not change the ledger:
// the caller applies it (credited() per slot, or arrived(slot)).
std::optional<Violation> checkCompletion(const Completion& c, const Limits& limits,
                                         const SlotLedger& ledger, Arrival& out);

// The header the peer wrote into `slot` (after checkCompletion accepted the
// arrival): magic, kind, flags, payload against the slot and the write's
// length, piggybacked credits against the ledger, advert fields.
std::optional<Violation> checkHeader(const Header& h, uint32_t byteLen, const Limits& limits,
                                     const SlotLedger& ledger);

// The bytes a point-to-point receive expects in its chunk `index`: the whole
// message is `bytes`, chunks of at most `chunk` payload bytes.
std::optional<Violation> checkPointToPointChunk(const Header& h, size_t bytes, size_t done,
                                                size_t chunk);

}  // namespace rdmacc::wire
