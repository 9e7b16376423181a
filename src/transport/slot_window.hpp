// One peer's slot traffic as the credit protocol sees it, whatever carries
// the bytes (RDMA writes, shared memory): which of the peer's slots this rank
// may write (its credits), which of ours hold the peer's messages, the credits
// owed back, and the validation of every arrival (wire::). Each transport
// keeps one per peer; the protocol is the same on every transport, so it has
// one owner.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "src/core/ring.hpp"
#include "src/transport/transport.hpp"
#include "src/transport/wire.hpp"

namespace rdmacc {

class SlotWindow {
 public:
  explicit SlotWindow(int slots = 0);

  // ------------------------------------------------------------- sending --
  // Whether a message may go now, leaving `reserve` credits untouched.
  bool canSend(size_t reserve) const { return freeRemote_.size() > reserve; }
  // The peer's slot the next message goes to (canSend() was true).
  int nextRemote() const { return freeRemote_.front(); }
  // That slot was written: the peer's until it hands it back.
  void sent();
  // The credits owed to the peer that fit a header's mask (slots 0..63),
  // now handed back.
  uint64_t takePiggybackCredits();
  bool owesCredits() const { return !pendingCredits_.empty(); }
  // One credit message's immediate (credits::take), handed back.
  uint32_t takeCreditMessage();
  // Whether the peer may be short of slots in our region: at least half of
  // them are consumed but not handed back, or hold messages not consumed
  // yet. Below that the peer still has half its window, so credits can wait
  // for a message to ride on instead of costing a message each.
  bool peerMayStall() const;

  // ----------------------------------------------------------- receiving --
  // An arrival as the carrier reported it. `slots`: our slots for this peer
  // (slot i at slots + i x slotBytes, the header at its start). A credit is
  // applied (nullopt returned, `out` untouched, *isMessage false); a message
  // is checked and recorded as held: `out` is its Incoming (arrival from
  // `arrivals`, which counts up). A violation leaves everything unchanged.
  std::optional<wire::Violation> accept(const wire::Completion& c, const uint8_t* slots,
                                        const wire::Limits& limits, uint64_t& arrivals,
                                        Incoming& out, bool& isMessage);
  // The message in `slot` was consumed; true when half the window waits for
  // its credit: it should go now.
  bool release(int slot);

  // "credits 3/8, 1 owed back, 2 held": for a diagnosis of a stall.
  std::string describe() const;

 private:
  void credited(int slot) {
    ledger_.credited(slot);
    freeRemote_.push_back(slot);
  }

  int slots_ = 0;
  Ring<int> freeRemote_;             // the peer's slots we may write (our credits)
  std::vector<int> pendingCredits_;  // released slots not yet handed back to the peer
  size_t unreleased_ = 0;            // arrived messages not yet released (each holds a slot)
  wire::SlotLedger ledger_;          // who owns which slot, both ways: checks every arrival
};

}  // namespace rdmacc
