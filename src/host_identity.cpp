#include "src/host_identity.hpp"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <fstream>
#include <memory>

#include <fmt/format.h>

#include "rdmacc/error.hpp"
#include "src/store_util.hpp"

namespace rdmacc {
namespace {

std::string firstLine(const char* path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

std::string link(const char* path) {
  std::array<char, 256> buffer{};
  ssize_t n = ::readlink(path, buffer.data(), buffer.size() - 1);
  return n > 0 ? std::string(buffer.data(), static_cast<size_t>(n)) : std::string("?");
}

}  // namespace

std::string hostIdentity(const std::string& override) {
  if (!override.empty()) return override;
  std::array<char, 256> host{};
  if (::gethostname(host.data(), host.size() - 1) != 0) host[0] = '\0';
  return fmt::format("{}/{}/{}/{}/{}", host.data(), firstLine("/proc/sys/kernel/random/boot_id"),
                     link("/proc/self/ns/mnt"), link("/proc/self/ns/net"),
                     link("/proc/self/ns/pid"));
}

std::vector<bool> sameHost(Store& store, const std::string& group, int rank, int size,
                           const std::string& identity, const std::string& transport) {
  PrefixStore hosts("rdmacc/host/" + group, std::shared_ptr<Store>(&store, [](Store*) {}));
  hosts.set(fmt::format("{}", rank), toBytes(transport + "\n" + identity));
  std::vector<bool> same(static_cast<size_t>(size), false);
  for (int peer = 0; peer < size; ++peer) {
    if (peer == rank) {
      same[static_cast<size_t>(peer)] = true;
      continue;
    }
    const std::string text = toString(hosts.get(fmt::format("{}", peer)));
    const auto newline = text.find('\n');
    const std::string theirs = text.substr(0, std::min(newline, size_t{16}));
    if (newline == std::string::npos || theirs != transport) {
      throw Error(
          ErrorInfo{.kind = ErrorKind::InvalidArgument,
                    .message = fmt::format("rank {} uses RDMACC_TRANSPORT={}, this rank {}", peer,
                                           theirs, transport),
                    .peerRank = peer,
                    .hint = "set RDMACC_TRANSPORT the same on every rank (or leave it at auto)"});
    }
    same[static_cast<size_t>(peer)] = text.compare(newline + 1, std::string::npos, identity) == 0;
  }
  return same;
}

}  // namespace rdmacc
