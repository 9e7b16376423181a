#include "src/store/auth.hpp"

#include <fcntl.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <vector>

#include <fmt/format.h>

#include "rdmacc/config.hpp"
#include "rdmacc/error.hpp"

namespace rdmacc::auth {
namespace {

constexpr size_t kMaxKeyFileBytes = 4096;

[[noreturn]] void bad(std::string message, std::string hint) {
  throw Error(ErrorKind::InvalidArgument, std::move(message), std::move(hint));
}

std::string readKeyFile(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) {
    bad(fmt::format("RDMACC_AUTH_KEY_FILE={}: cannot open it: {}", path, std::strerror(errno)),
        "give a regular file (not a symbolic link) readable by this user");
  }
  struct stat st {};
  std::string key;
  try {
    if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
      bad(fmt::format("RDMACC_AUTH_KEY_FILE={} is not a regular file", path),
          "give a regular file holding the key");
    }
    if ((st.st_mode & 077) != 0) {
      bad(fmt::format("RDMACC_AUTH_KEY_FILE={} is accessible by group or others (mode {:03o})",
                      path, st.st_mode & 0777),
          fmt::format("chmod 600 {}", path));
    }
    std::vector<char> buf(kMaxKeyFileBytes + 1);
    size_t used = 0;
    while (used < buf.size()) {
      const ssize_t n = ::read(fd, buf.data() + used, buf.size() - used);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        bad(fmt::format("RDMACC_AUTH_KEY_FILE={}: cannot read it: {}", path, std::strerror(errno)),
            "make the file readable by this user");
      }
      if (n == 0) break;
      used += static_cast<size_t>(n);
    }
    if (used > kMaxKeyFileBytes) {
      bad(fmt::format("RDMACC_AUTH_KEY_FILE={} holds more than {} bytes", path, kMaxKeyFileBytes),
          "a key of 32 random bytes is plenty: head -c 32 /dev/urandom | base64 > FILE");
    }
    key.assign(buf.data(), used);
  } catch (...) {
    ::close(fd);
    throw;
  }
  ::close(fd);
  // One line, as `openssl rand -base64 32 > FILE` writes it.
  while (!key.empty() && (key.back() == '\n' || key.back() == '\r')) key.pop_back();
  return key;
}

}  // namespace

std::string loadKey(const Config& config) {
  const std::string& inline_ = config.getString("RDMACC_AUTH_KEY");
  const std::string& file = config.getString("RDMACC_AUTH_KEY_FILE");
  if (!inline_.empty() && !file.empty()) {
    bad("both RDMACC_AUTH_KEY and RDMACC_AUTH_KEY_FILE are set",
        "set one of them (the file keeps the key out of the environment of every process)");
  }
  if (file.empty()) return inline_;
  std::string key = readKeyFile(file);
  if (key.empty()) {
    bad(fmt::format("RDMACC_AUTH_KEY_FILE={} is empty", file),
        "write a key into it: head -c 32 /dev/urandom | base64 > FILE; chmod 600 FILE");
  }
  return key;
}

Nonce nonce() {
  Nonce n{};
  size_t used = 0;
  while (used < n.size()) {
    const ssize_t got = ::getrandom(n.data() + used, n.size() - used, 0);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) throw errnoError(ErrorKind::Internal, "getrandom", errno, "making a nonce");
    used += static_cast<size_t>(got);
  }
  return n;
}

Mac mac(std::string_view key, std::string_view label, std::span<const uint8_t> first,
        std::span<const uint8_t> second) {
  std::vector<uint8_t> message;
  message.reserve(label.size() + 1 + first.size() + second.size());
  message.insert(message.end(), label.begin(), label.end());
  message.push_back(0);
  message.insert(message.end(), first.begin(), first.end());
  message.insert(message.end(), second.begin(), second.end());
  Mac out{};
  unsigned int length = 0;
  if (HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()), message.data(), message.size(),
           out.data(), &length) == nullptr ||
      length != out.size()) {
    throw Error(ErrorKind::Internal, "HMAC-SHA256 failed (OpenSSL)");
  }
  return out;
}

bool same(const Mac& mac, const uint8_t* other, size_t bytes) noexcept {
  return CRYPTO_memcmp(mac.data(), other, std::min(bytes, mac.size())) == 0;
}

std::string groupSecret(std::string_view key, std::string_view group, std::string_view salt) {
  const Mac m = mac(key, "rdmacc group secret",
                    std::span(reinterpret_cast<const uint8_t*>(group.data()), group.size()),
                    std::span(reinterpret_cast<const uint8_t*>(salt.data()), salt.size()));
  return {reinterpret_cast<const char*>(m.data()), m.size()};
}

std::string randomHex() {
  const Nonce n = nonce();
  std::string text;
  text.reserve(2 * n.size());
  for (uint8_t b : n) text += fmt::format("{:02x}", b);
  return text;
}

}  // namespace rdmacc::auth
