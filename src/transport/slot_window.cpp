#include "src/transport/slot_window.hpp"

#include <algorithm>
#include <bit>
#include <cstring>

#include <fmt/format.h>

#include "rdmacc/error.hpp"
#include "src/transport/credits.hpp"

namespace rdmacc {

SlotWindow::SlotWindow(int slots) : slots_(slots), ledger_(slots) {
  freeRemote_.reserve(static_cast<size_t>(slots));
  for (int i = 0; i < slots; ++i) freeRemote_.push_back(i);
  // Bounded by the slots: reserved once, never allocated per message.
  pendingCredits_.reserve(static_cast<size_t>(slots));
}

void SlotWindow::sent() {
  ledger_.written(freeRemote_.front());
  freeRemote_.pop_front();
}

uint64_t SlotWindow::takePiggybackCredits() {
  uint64_t mask = 0;
  for (auto it = pendingCredits_.begin(); it != pendingCredits_.end();) {
    if (*it < 64) {
      mask |= uint64_t{1} << *it;
      ledger_.handedBack(*it);
      it = pendingCredits_.erase(it);
    } else {
      ++it;
    }
  }
  return mask;
}

uint32_t SlotWindow::takeCreditMessage() {
  const uint32_t imm = credits::take(pendingCredits_);
  credits::forEach(imm, [&](int slot) { ledger_.handedBack(slot); });
  return imm;
}

bool SlotWindow::peerMayStall() const {
  return !pendingCredits_.empty() &&
         (pendingCredits_.size() + unreleased_) * 2 >= static_cast<size_t>(slots_);
}

std::optional<wire::Violation> SlotWindow::accept(const wire::Completion& c, const uint8_t* slots,
                                                  const wire::Limits& limits, uint64_t& arrivals,
                                                  Incoming& out, bool& isMessage) {
  isMessage = false;
  wire::Arrival arrival;
  if (auto bad = wire::checkCompletion(c, limits, ledger_, arrival)) return bad;
  if (arrival.credit) {
    credits::forEach(c.imm, [&](int slot) { credited(slot); });
    return std::nullopt;
  }
  const int slot = arrival.slot;
  Incoming in{slot, {}, 0};
  std::memcpy(&in.header, slots + static_cast<size_t>(slot) * limits.slotBytes, sizeof in.header);
  if (auto bad = wire::checkHeader(in.header, c.byteLen, limits, ledger_)) {
    return wire::Violation{fmt::format("{} (slot {})", bad->what, slot)};
  }
  ledger_.arrived(slot);
  ++unreleased_;
  for (uint64_t m = in.header.credits; m != 0; m &= m - 1) credited(std::countr_zero(m));
  in.arrival = arrivals++;
  out = in;
  isMessage = true;
  return std::nullopt;
}

bool SlotWindow::release(int slot) {
  // A slot released twice would hand its credit back twice: the peer, once
  // it wrote the slot again, would take the second for a release of the new
  // message and overwrite it. Refuse instead (an rdmacc bug, never a peer's).
  if (slot < 0 || slot >= slots_ || !ledger_.held(slot) ||
      std::find(pendingCredits_.begin(), pendingCredits_.end(), slot) != pendingCredits_.end()) {
    throw Error(ErrorKind::Internal,
                fmt::format("slot {} released while it holds no unreleased message", slot));
  }
  --unreleased_;
  pendingCredits_.push_back(slot);
  return pendingCredits_.size() * 2 >= static_cast<size_t>(slots_);
}

std::string SlotWindow::describe() const {
  return fmt::format("credits {}/{}, {} owed back, {} held", freeRemote_.size(), slots_,
                     pendingCredits_.size(), unreleased_);
}

}  // namespace rdmacc
