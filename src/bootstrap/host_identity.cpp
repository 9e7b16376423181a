#include "src/bootstrap/host_identity.hpp"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <fstream>
#include <map>
#include <memory>
#include <string_view>

#include <fmt/format.h>

#include "rdmacc/environment.hpp"
#include "rdmacc/error.hpp"
#include "rdmacc/log.hpp"
#include "rdmacc/version.hpp"
#include "src/store/store_util.hpp"
#include "src/transport/rdma/handshake.hpp"

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
  return fmt::format("{}/{}/{}/{}/{}", hostName(), firstLine("/proc/sys/kernel/random/boot_id"),
                     link("/proc/self/ns/mnt"), link("/proc/self/ns/net"),
                     link("/proc/self/ns/pid"));
}

std::vector<int> hostNumbers(Store& store, const AllGather& allGather, const std::string& group,
                             int rank, int size, const std::string& identity,
                             const std::string& agreed, const std::vector<std::string>& carried,
                             std::vector<std::vector<std::string>>* carriedRecords) {
  // Line 1: what this rank speaks (the versions a mismatch error names);
  // line 2: the settings every rank must share; then one line per carried
  // record (shared memory's, the RDMA addresses: one record per rank for
  // all, 2N store requests per group); the rest: its host identity.
  const std::string mine = fmt::format("rdmacc {} protocol {}", version(), handshake::kVersion);
  std::vector<std::string> identities(static_cast<size_t>(size));
  // Every peer's record at once (O(N) requests per group, not N x N).
  std::vector<int> everyone, peers;
  for (int peer = 0; peer < size; ++peer) {
    everyone.push_back(peer);
    if (peer != rank) peers.push_back(peer);
  }
  std::string record = mine + "\n" + agreed + "\n";
  for (const std::string& line : carried) {
    if (line.find('\n') != std::string::npos || line.size() > kCarriedLineBytes) {
      throw Error(ErrorKind::Internal,
                  fmt::format("a host record line is malformed: '{}'", line.substr(0, 64)));
    }
    record += line + "\n";
  }
  const std::vector<Bytes> records = exchangeRecords(store, allGather, "rdmacc/host/" + group, rank,
                                                     toBytes(record + identity), everyone, peers);
  if (carriedRecords != nullptr) carriedRecords->assign(static_cast<size_t>(size), carried);
  for (int peer = 0; peer < size; ++peer) {
    if (peer == rank) {
      identities[static_cast<size_t>(peer)] = identity;
      continue;
    }
    const std::string text = toString(records[static_cast<size_t>(peer < rank ? peer : peer - 1)]);
    const auto first = text.find('\n');
    const auto second = first == std::string::npos ? first : text.find('\n', first + 1);
    // At most 64 bytes of a peer's text in a message: it is hostile input.
    const std::string speaks = text.substr(0, std::min(first, size_t{64}));
    if (first == std::string::npos || speaks.rfind("rdmacc ", 0) != 0) {
      throw Error(ErrorInfo{
          .kind = ErrorKind::Protocol,
          .message = fmt::format("rank {} runs an rdmacc that does not state its version (it "
                                 "wrote '{}'); this rank runs {}",
                                 peer, speaks, mine),
          .peerRank = peer,
          .hint = "install the same rdmacc on every node (one venv or prefix on the shared "
                  "file system)"});
    }
    const std::string protocol = fmt::format("protocol {}", handshake::kVersion);
    if (!speaks.ends_with(" " + protocol)) {
      throw Error(ErrorInfo{
          .kind = ErrorKind::Protocol,
          .message = fmt::format("rank {} runs {}, this rank {}: their protocols differ", peer,
                                 speaks, mine),
          .peerRank = peer,
          .hint = "install the same rdmacc on every node (one venv or prefix on the shared "
                  "file system)"});
    }
    if (speaks != mine) {
      log(LogLevel::Info, "rank {} runs {}, this rank {} (the same protocol)", peer, speaks, mine);
    }
    const std::string theirs =
        second == std::string::npos
            ? std::string()
            : text.substr(first + 1, std::min(second - first - 1, size_t{96}));
    if (second == std::string::npos || theirs != agreed) {
      throw Error(ErrorInfo{
          .kind = ErrorKind::InvalidArgument,
          .message = fmt::format("rank {} runs with {}, this rank with {}", peer, theirs, agreed),
          .peerRank = peer,
          .hint = "set these the same on every rank (or leave them at their defaults)"});
    }
    // The carried lines, each bounded, then the identity.
    size_t at = second + 1;
    for (size_t line = 0; line < carried.size(); ++line) {
      const auto end = text.find('\n', at);
      if (end == std::string::npos || end - at > kCarriedLineBytes) {
        throw Error(ErrorInfo{
            .kind = ErrorKind::Protocol,
            .message = fmt::format("rank {} published a host record with {} of its {} carried "
                                   "lines (shared memory, RDMA addresses)",
                                   peer, line, carried.size()),
            .peerRank = peer});
      }
      if (carriedRecords != nullptr) {
        (*carriedRecords)[static_cast<size_t>(peer)][line] = text.substr(at, end - at);
      }
      at = end + 1;
    }
    identities[static_cast<size_t>(peer)] = text.substr(at);
  }
  std::vector<int> number(static_cast<size_t>(size));
  std::map<std::string_view, int> seen;
  for (size_t r = 0; r < identities.size(); ++r) {
    number[r] = seen.emplace(identities[r], static_cast<int>(seen.size())).first->second;
  }
  return number;
}

}  // namespace rdmacc
