// The shared secret of a job (RDMACC_AUTH_KEY or RDMACC_AUTH_KEY_FILE) and
// what it is used for: the TCP store's challenge-response (HMAC-SHA256 over
// both sides' nonces, so neither the key nor a reusable answer travels) and
// the secret of the rdma_cm handshake, derived from the key and a salt in
// the store rather than stored itself.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

namespace rdmacc {
class Config;
}

namespace rdmacc::auth {

constexpr size_t kNonceBytes = 32;
constexpr size_t kMacBytes = 32;
using Nonce = std::array<uint8_t, kNonceBytes>;
using Mac = std::array<uint8_t, kMacBytes>;

// The key, "" when neither variable is set. Throws Error(InvalidArgument)
// when both are set, the file cannot be read, is readable or writable by
// group or others (chmod 600), or the key is empty.
std::string loadKey(const Config& config);

// Unpredictable bytes from the kernel (getrandom).
Nonce nonce();

// HMAC-SHA256(key, label || 0 || first || second).
Mac mac(std::string_view key, std::string_view label, std::span<const uint8_t> first,
        std::span<const uint8_t> second);

// Constant-time comparison of the first `bytes` (at most kMacBytes) of a MAC
// with the bytes at `other`.
bool same(const Mac& mac, const uint8_t* other, size_t bytes = kMacBytes) noexcept;

// The secret that keys the proofs of a group's rdma_cm hellos
// (src/transport/rdma/handshake.hpp): from the key, the group's name and the salt rank 0
// published; 32 bytes. Without the key nobody can compute it from what the
// store or the fabric shows.
std::string groupSecret(std::string_view key, std::string_view group, std::string_view salt);

// Hexadecimal text of a fresh nonce (a salt, or a group secret without a key).
std::string randomHex();

}  // namespace rdmacc::auth
