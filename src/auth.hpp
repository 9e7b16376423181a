// The shared secret of a job (RDMACC_AUTH_KEY or RDMACC_AUTH_KEY_FILE) and
// what it is used for: the TCP store's challenge-response (HMAC-SHA256 over
// both sides' nonces, so neither the key nor a reusable answer travels) and
// the group token of the rdma_cm handshake, derived from the key and a salt
// in the store rather than stored itself.
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

// Constant-time comparison of a MAC with kMacBytes bytes at `other`.
bool same(const Mac& mac, const uint8_t* other) noexcept;

// The rdma_cm handshake token of a group: from the key, the group's name
// and the salt rank 0 published (a stolen token of one group or run says
// nothing about another's).
uint64_t groupToken(std::string_view key, std::string_view group, std::string_view salt);

}  // namespace rdmacc::auth
