// Eager formation: higher ranks connect to the lower ranks' addresses as
// they appear in the store while accepting the higher ranks' requests, until
// every queue pair is up; past RDMACC_CONNECT_TIMEOUT the error names the
// ranks that never arrived or never connected, and a failure elsewhere
// (the store's "abort" key) ends the wait early.
#include <fmt/format.h>

#include "rdmacc/error.hpp"
#include "src/store/store_util.hpp"
#include "src/transport/rdma/mesh_connector.hpp"

namespace rdmacc {
namespace {

using namespace std::chrono_literals;

constexpr auto kAddressPoll = 50ms;

std::string rankList(const std::vector<int>& ranks) {
  return fmt::format("{}", fmt::join(ranks, ", "));
}

}  // namespace

const char* const Mesh::Connector::kMissingHint =
    "start every rank (WORLD_SIZE must match the number of processes), check their output for "
    "errors, or raise RDMACC_CONNECT_TIMEOUT";

// The addresses of the lower ranks, all at once: one check of every key
// per kAddressPoll (never blocking the event loop, which accepts the higher
// ranks meanwhile), then one multiGet. Per rank, a handful of requests
// whatever the group's size, where a check per peer per loop was N x N.
void Mesh::Connector::lookUpAddresses() {
  if (addressesKnown) return;
  const auto now = Clock::now();
  if (now < nextAddressPoll) return;
  nextAddressPoll = now + kAddressPoll;
  std::vector<int> peers;
  std::vector<std::string> addressKeys;
  for (int peer = 0; peer < mesh.rank_; ++peer) {
    if (skipped(peer)) continue;
    peers.push_back(peer);
    addressKeys.push_back(fmt::format("addr/{}", peer));
  }
  if (!addressKeys.empty() && !store->check(addressKeys)) return;
  addressesKnown = true;
  const std::vector<Bytes> values = store->multiGet(addressKeys);
  for (size_t i = 0; i < peers.size(); ++i) {
    const int peer = peers[i];
    const std::string& key = addressKeys[i];
    std::string text = toString(values[i]);
    auto colon = text.rfind(':');
    if (colon == std::string::npos) {
      throw Error(ErrorKind::Protocol,
                  fmt::format("rank {} published a malformed address '{}'", peer, text));
    }
    auto port =
        static_cast<uint16_t>(storeNumber(std::string_view(text).substr(colon + 1), 65535, key));
    if (port == 0) {
      throw Error(ErrorKind::Protocol,
                  fmt::format("rank {} published the address '{}' with port 0", peer, text));
    }
    addresses[static_cast<size_t>(peer)].emplace(text.substr(0, colon), port);
    mesh.peerAddresses_[peer] = text;
    for (int q = 0; q < mesh.qpsPerPeer_; ++q) startActive(peer, q);
  }
}

Mesh::Connector::Missing Mesh::Connector::missing() {
  std::vector<int> absent, unconnected;
  for (int peer = 0; peer < mesh.size_; ++peer) {
    if (peer == mesh.rank_ || skipped(peer)) continue;
    bool done = true;
    for (int q = 0; q < mesh.qpsPerPeer_; ++q) done = done && slot(peer, q) != nullptr;
    if (done) continue;
    bool published = addresses[static_cast<size_t>(peer)].has_value();
    try {
      published = published || store->check({fmt::format("addr/{}", peer)});
    } catch (const Error&) {
    }
    (published ? unconnected : absent).push_back(peer);
  }
  std::string what;
  if (!absent.empty())
    what = fmt::format("rank(s) {} never arrived (no address in the store)", rankList(absent));
  if (!unconnected.empty()) {
    what += fmt::format("{}rank(s) {} arrived but did not connect", what.empty() ? "" : "; ",
                        rankList(unconnected));
  }
  Missing m{.absent = absent, .ranks = absent, .what = what};
  m.ranks.insert(m.ranks.end(), unconnected.begin(), unconnected.end());
  return m;
}

void Mesh::Connector::timeout() {
  Missing m = missing();
  throw Error(ErrorInfo{
      .kind = ErrorKind::Timeout,
      .message = fmt::format("rank {} of {}: the group did not form within {} ms: {}", mesh.rank_,
                             mesh.size_, mesh.connectTimeout_.count(), m.what),
      .peerRank = m.ranks.size() == 1 ? m.ranks.front() : -1,
      .hint = kMissingHint});
}

void Mesh::Connector::checkAbort() {
  if (!store->check({"abort"})) return;
  std::string why = toString(store->get("abort"));
  throw Error(ErrorKind::PeerFailure,
              fmt::format("another rank failed while the group was forming: {}", why));
}

// A look for the store's "abort" key after kAbortLook, then at doubling
// gaps up to kAbortLookMax: a failure elsewhere ends the wait within a few
// seconds, and a formation makes a handful of store requests per rank
// however long it takes (Scale II asks 2 N + O(1) per job).
constexpr auto kAbortLook = 500ms;
constexpr auto kAbortLookMax = 4000ms;

void Mesh::Connector::run() {
  auto abortGap = std::chrono::duration_cast<Clock::duration>(kAbortLook);
  auto nextAbortCheck = Clock::now() + abortGap;
  while (connected < needed()) {
    if (Clock::now() > deadline) timeout();
    lookUpAddresses();
    auto now = Clock::now();
    for (auto it = retries.begin(); it != retries.end();) {
      if (it->first <= now) {
        startActive(it->second.first, it->second.second);
        it = retries.erase(it);
      } else {
        ++it;
      }
    }
    if (now >= nextAbortCheck) {
      checkAbort();
      abortGap = std::min<Clock::duration>(2 * abortGap, kAbortLookMax);
      nextAbortCheck = now + abortGap;
    }
    while (auto event = mesh.events_->next(20ms)) handle(std::move(event));
  }
}

void Mesh::connectPeers(Store& groupStore, std::chrono::steady_clock::time_point deadline,
                        std::vector<Connector::Address> known) {
  Connector setup{.mesh = *this, .store = &groupStore, .deadline = deadline};
  setup.connectionView.assign(connections_.size(), nullptr);
  if (known.empty()) {
    setup.addresses.resize(static_cast<size_t>(size_));
  } else {  // published with the host records: connect to the lower ranks now
    setup.addresses = std::move(known);
    setup.addressesKnown = true;
    for (int peer = 0; peer < rank_; ++peer) {
      if (setup.skipped(peer)) continue;
      for (int q = 0; q < qpsPerPeer_; ++q) setup.startActive(peer, q);
    }
  }
  setup.run();
}

}  // namespace rdmacc
