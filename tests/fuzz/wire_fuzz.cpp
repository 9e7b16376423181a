// libFuzzer target for src/transport/wire: a peer's arrivals (completion, immediate,
// header bytes) in any order and content, against a receiver that applies
// what it accepts exactly as the engine does. Under ASan a payload accepted
// for a receive is copied into a buffer of exactly the receive's size, so a
// validation that lets too many bytes through is an overflow report.
//
//   cmake -S . -B build-fuzz -DCMAKE_CXX_COMPILER=clang++ -DRDMACC_FUZZ=ON
//   ninja -C build-fuzz rdmacc_wire_fuzz && build-fuzz/tests/fuzz/rdmacc_wire_fuzz
//   -max_total_time=60
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "src/transport/credits.hpp"
#include "src/transport/wire.hpp"

namespace {

using namespace rdmacc::wire;
namespace credits = rdmacc::credits;

struct Reader {
  const uint8_t* p;
  size_t n;
  template <typename T>
  T take() {
    T v{};
    size_t k = n < sizeof v ? n : sizeof v;
    std::memcpy(&v, p, k);
    p += k;
    n -= k;
    return v;
  }
};

void check(bool ok) {
  if (!ok) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Reader in{data, size};
  const int slots = 1 + in.take<uint8_t>() % 80;  // across the 64-slot piggyback boundary
  const size_t slotBytes = kHeaderBytes + 64 * (1 + in.take<uint8_t>() % 8);
  const Limits limits{.slotsPerPeer = slots, .slotBytes = slotBytes};
  const size_t chunk = slotBytes - kHeaderBytes;
  std::vector<uint8_t> region(static_cast<size_t>(slots) * slotBytes);
  SlotLedger ledger(slots);
  // A point-to-point receive the peer's messages may be matched with.
  const size_t recvBytes = in.take<uint16_t>() % (4 * chunk + 1);
  std::vector<uint8_t> recvBuffer(recvBytes);
  size_t received = 0;
  while (in.n > 0) {
    const uint8_t action = in.take<uint8_t>();
    if (action % 4 == 0) {  // this rank writes one of the peer's slots
      const int s = in.take<uint8_t>() % slots;
      if (ledger.sendable(s)) ledger.written(s);
      continue;
    }
    if (action % 4 == 1) {  // this rank hands a consumed slot back
      const int s = in.take<uint8_t>() % slots;
      if (ledger.held(s)) ledger.handedBack(s);
      continue;
    }
    // The peer's write: a header (from the input) and its length, either as
    // the input says or consistent with the header (a well-formed peer's).
    Header h = in.take<Header>();
    if (action & 0x80) h.magic = kMagic;
    Completion c{.rdmaWriteWithImm = (action & 0x10) == 0,
                 .withImm = (action & 0x20) == 0,
                 .imm = in.take<uint32_t>(),
                 .byteLen = in.take<uint32_t>()};
    if (action & 0x40) {
      c.imm &= 0x8000ffffu;
      c.byteLen = credits::isCredit(c.imm)
                      ? 0
                      : static_cast<uint32_t>(kHeaderBytes + ((h.flags & kDirect) ? 0 : h.payload));
    }
    Arrival arrival;
    if (checkCompletion(c, limits, ledger, arrival)) continue;
    if (arrival.credit) {
      credits::forEach(c.imm, [&](int s) {
        check(s < slots && !ledger.sendable(s));
        ledger.credited(s);
      });
      continue;
    }
    check(arrival.slot >= 0 && arrival.slot < slots && !ledger.held(arrival.slot));
    check(c.byteLen >= kHeaderBytes && c.byteLen <= slotBytes);
    uint8_t* slot = region.data() + static_cast<size_t>(arrival.slot) * slotBytes;
    std::memcpy(slot, &h, sizeof h);
    Header got;
    std::memcpy(&got, slot, sizeof got);
    if (checkHeader(got, c.byteLen, limits, ledger)) continue;
    ledger.arrived(arrival.slot);
    for (uint64_t m = got.credits; m != 0; m &= m - 1) {
      const int s = __builtin_ctzll(m);
      check(s < slots && !ledger.sendable(s));
      ledger.credited(s);
    }
    check(got.payload <= chunk);
    if (got.kind == MessageKind::PointToPoint && received < recvBytes) {
      if (checkPointToPointChunk(got, recvBytes, received, chunk)) continue;
      // What the engine's receive does with an accepted chunk.
      std::memcpy(recvBuffer.data() + received, slot + kHeaderBytes, got.payload);
      received += got.payload;
    }
  }
  return 0;
}
