// The RDMA board's entry format (transport/rdma/board.cpp): a one-shot contribution as
// one RDMA WRITE into the peer's memory, read there by polling. The bytes of
// one write may be placed in any order (the InfiniBand specification orders
// nothing inside a message), so every 8-byte word carries its own flag next
// to 4 bytes of content, as NCCL's LL protocol does: a word is there when
// its flag is the operation's, and a reader polls until every word of the
// entry is. Aligned 8-byte words are placed whole.
//
// Words: the collective's sequence (2), its check value (2), the payload's
// size in bytes (2), then the payload, 4 bytes a word (the last one padded
// with zeros).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>

#include <fmt/format.h>

namespace rdmacc::board_words {

inline constexpr size_t kHeadWords = 6;

constexpr size_t payloadWords(size_t bytes) {
  return (bytes + 3) / 4;
}
constexpr size_t entryWords(size_t bytes) {
  return kHeadWords + payloadWords(bytes);
}
// The largest payload an entry of `entryBytes` holds.
constexpr size_t maxPayload(size_t entryBytes) {
  return entryBytes / 8 > kHeadWords ? (entryBytes / 8 - kHeadWords) * 4 : 0;
}

constexpr uint64_t word(uint32_t flag, uint32_t content) {
  return static_cast<uint64_t>(flag) << 32 | content;
}

// Encodes an entry (entryWords(bytes) words) into `out`.
inline void encode(uint64_t* out, uint32_t flag, uint64_t sequence, uint64_t check,
                   const uint8_t* data, size_t bytes) {
  auto split = [&](size_t at, uint64_t v) {
    out[at] = word(flag, static_cast<uint32_t>(v));
    out[at + 1] = word(flag, static_cast<uint32_t>(v >> 32));
  };
  split(0, sequence);
  split(2, check);
  split(4, bytes);
  for (size_t w = 0; w < payloadWords(bytes); ++w) {
    uint32_t content = 0;
    std::memcpy(&content, data + 4 * w, std::min<size_t>(4, bytes - 4 * w));
    out[kHeadWords + w] = word(flag, content);
  }
}

struct Decoded {
  uint64_t sequence = 0;
  uint64_t check = 0;
  uint64_t bytes = 0;
};

enum class State { Pending, Complete, Corrupt };

struct Result {
  State state = State::Pending;
  Decoded head;
  std::string problem;  // Corrupt: what was found
};

// Reads the entry a peer writes into (`words`, entryWords(bytes) of them)
// for the operation flagged `flag`; `previous` is the flag the entry held
// before (0: never written). Pending while any word still holds `previous`;
// Corrupt when a word holds any other flag or, once complete, the payload
// size field exceeds the entry. `payload` receives the decoded payload
// (`bytes` of it) when complete.
inline Result decode(const uint64_t* words, size_t bytes, uint32_t flag, uint32_t previous,
                     uint8_t* payload) {
  Result r;
  const size_t n = entryWords(bytes);
  for (size_t w = 0; w < n; ++w) {
    const uint64_t v = std::atomic_ref<const uint64_t>(words[w]).load(std::memory_order_relaxed);
    const auto f = static_cast<uint32_t>(v >> 32);
    if (f == flag) continue;
    if (f == previous) return r;  // not all there yet
    r.state = State::Corrupt;
    r.problem = fmt::format(
        "word {} of its entry is flagged {:#x}, expected {:#x} (or the "
        "previous {:#x})",
        w, f, flag, previous);
    return r;
  }
  std::atomic_thread_fence(std::memory_order_acquire);
  // Read atomically again: a writer in this process (a test's) stores them
  // so, and the sanitizers see no race.
  auto at = [&](size_t w) {
    return std::atomic_ref<const uint64_t>(words[w]).load(std::memory_order_relaxed);
  };
  auto join = [&](size_t w) {
    return static_cast<uint64_t>(static_cast<uint32_t>(at(w))) |
           static_cast<uint64_t>(static_cast<uint32_t>(at(w + 1))) << 32;
  };
  r.head = Decoded{.sequence = join(0), .check = join(2), .bytes = join(4)};
  r.state = State::Complete;
  for (size_t w = 0; w < payloadWords(bytes); ++w) {
    const auto content = static_cast<uint32_t>(at(kHeadWords + w));
    std::memcpy(payload + 4 * w, &content, std::min<size_t>(4, bytes - 4 * w));
  }
  return r;
}

}  // namespace rdmacc::board_words
