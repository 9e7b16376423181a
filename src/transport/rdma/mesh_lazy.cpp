// Connecting on first use (RDMACC_CONNECT, docs/decisions/010): whoever
// needs a peer first connects to it; when both do at once, the higher
// rank's connection wins (the lower rank's is refused as Crossed), so the
// pair agrees without a global step. A peer that cannot be reached within
// RDMACC_CONNECT_TIMEOUT is reported failed; the connector lives as long as
// the mesh and is driven by the progress thread (progressConnections).
#include <algorithm>
#include <utility>

#include <fmt/format.h>

#include "rdmacc/error.hpp"
#include "rdmacc/log.hpp"
#include "src/transport/rdma/mesh_connector.hpp"

namespace rdmacc {

// Lazy: connecting to peer failed for good (its operations fail with this).
void Mesh::Connector::fail(int peer, Error error) {
  const auto p = static_cast<size_t>(peer);
  if (failed[p]) return;
  failed[p] = true;
  giveUpAt[p] = {};
  std::erase_if(retries, [&](const auto& r) { return r.second.first == peer; });
  log(LogLevel::Debug, "connecting to rank {} failed: {}", peer, error.what());
  out.failed.emplace_back(peer, std::move(error));
}

// Forgets every attempt for peer (their ids are destroyed with them).
void Mesh::Connector::dropAttempts(int peer) {
  std::erase_if(attempts, [&](const auto& entry) { return entry.second.peer == peer; });
}

// Whether (peer, q) is connected or an attempt or retry for it is under way.
bool Mesh::Connector::busy(int peer, int q) {
  if (slot(peer, q) != nullptr) return true;
  for (const auto& [id, a] : attempts) {
    if (a.peer == peer && a.qpIndex == q) return true;
  }
  return std::any_of(retries.begin(), retries.end(),
                     [&](const auto& r) { return r.second == std::pair(peer, q); });
}

// Queued, and started by the next progress(): an operation that names many
// peers at once (an alltoall's N - 1) queues them all first, so that the
// nearest start first and the ranks' first requests spread over the group
// instead of all going to rank 0.
void Mesh::Connector::connect(int peer) {
  const auto p = static_cast<size_t>(peer);
  if (failed[p] || lanesUp[p] == mesh.qpsPerPeer_ || isWaiting[p]) return;
  isWaiting[p] = true;
  waiting.push_back(peer);
  noteConnecting();
}

int Mesh::Connector::activePeers() const {
  std::vector<int> peers;
  for (const auto& [id, a] : attempts) {
    if (a.role == Role::Active) peers.push_back(a.peer);
  }
  for (const auto& r : retries) peers.push_back(r.second.first);
  std::sort(peers.begin(), peers.end());
  return static_cast<int>(std::unique(peers.begin(), peers.end()) - peers.begin());
}

// The window bounds what this rank asks of the others at once: a peer
// accepts requests one after another, and a request's deadline runs while
// it waits there, so an operation that names every peer must not send all
// its requests at once (docs/decisions/010, follow-up 2).
void Mesh::Connector::startWaiting() {
  const int n = mesh.size_;
  auto distance = [&](int peer) { return (mesh.rank_ - peer + n) % n; };
  int active = activePeers();
  while (!waiting.empty() && active < mesh.connectWindow_) {
    auto next = std::min_element(waiting.begin(), waiting.end(),
                                 [&](int a, int b) { return distance(a) < distance(b); });
    const int peer = *next;
    waiting.erase(next);
    isWaiting[static_cast<size_t>(peer)] = false;
    const auto p = static_cast<size_t>(peer);
    if (failed[p] || lanesUp[p] == mesh.qpsPerPeer_) continue;
    start(peer);
    active = activePeers();
  }
  noteConnecting();
}

void Mesh::Connector::start(int peer) {
  const auto p = static_cast<size_t>(peer);
  bool started = false;
  for (int q = 0; q < mesh.qpsPerPeer_; ++q) {
    if (busy(peer, q)) continue;
    if (giveUpAt[p] == Clock::time_point{}) giveUpAt[p] = Clock::now() + mesh.connectTimeout_;
    startActive(peer, q);
    started = true;
  }
  noteConnecting();  // startActive may have failed the peer instead
  if (started) log(LogLevel::Debug, "connecting to rank {} on first use", peer);
}

// Lazy, a request from peer for queue pair q while this rank connects to
// it too: the higher rank's connection wins. Ours dropped (nullopt: accept
// theirs) or theirs refused.
std::optional<handshake::RejectReason> Mesh::Connector::crossed(
    int peer, int q, std::vector<verbs::CmIdPtr>& discard) {
  // Only an attempt of ours counts: a request repeated while we accept an
  // earlier one of the peer's replaces that (below, in onConnectRequest).
  bool ours = std::any_of(retries.begin(), retries.end(),
                          [&](const auto& r) { return r.second == std::pair(peer, q); });
  for (const auto& [id, a] : attempts) {
    ours = ours || (a.role == Role::Active && a.peer == peer && a.qpIndex == q);
  }
  if (!ours) return std::nullopt;
  if (peer < mesh.rank_) return handshake::RejectReason::Crossed;
  std::erase_if(retries, [&](const auto& r) { return r.second == std::pair(peer, q); });
  for (auto it = attempts.begin(); it != attempts.end(); ++it) {
    if (it->second.role == Role::Active && it->second.peer == peer && it->second.qpIndex == q) {
      discard.push_back(std::move(it->second.id));
      attempts.erase(it);
      break;
    }
  }
  return std::nullopt;
}

// Lazy: an error while handling an event fails the peer it concerns (a
// request that cannot be answered is dropped: its sender retries).
void Mesh::Connector::handleLazily(verbs::CmEventPtr event) {
  int peer = -1;
  if (auto it = attempts.find(event->id); it != attempts.end()) peer = it->second.peer;
  try {
    handle(std::move(event));
  } catch (const Error& e) {
    if (peer < 0) {
      log(LogLevel::Warn, "rank {}: a connection request failed: {}", mesh.rank_, e.what());
      return;
    }
    dropAttempts(peer);
    fail(peer, e);
  }
}

MeshEvents Mesh::Connector::progress() {
  const auto now = Clock::now();
  for (auto it = retries.begin(); it != retries.end();) {
    if (it->first > now) {
      ++it;
      continue;
    }
    auto [peer, q] = it->second;
    it = retries.erase(it);
    if (!failed[static_cast<size_t>(peer)] && !busy(peer, q)) startActive(peer, q);
  }
  for (int peer = 0; peer < mesh.size_; ++peer) {
    const auto p = static_cast<size_t>(peer);
    if (giveUpAt[p] == Clock::time_point{} || now < giveUpAt[p]) continue;
    bool active = std::any_of(retries.begin(), retries.end(),
                              [&](const auto& r) { return r.second.first == peer; });
    for (const auto& [id, a] : attempts)
      active = active || (a.peer == peer && a.role == Role::Active);
    if (!active) continue;  // its own connection to us is under way
    dropAttempts(peer);
    fail(peer, Error(ErrorInfo{
                   .kind = ErrorKind::Timeout,
                   .message = fmt::format(
                       "rank {}: could not connect to rank {} within {} ms{}", mesh.rank_, peer,
                       mesh.connectTimeout_.count(),
                       lastProblem[p].empty() ? "" : "; last attempt: " + lastProblem[p]),
                   .peerRank = peer,
                   .peerAddress = mesh.peerAddresses_[p],
                   .hint = "the peer process may have failed (see its output), or the network "
                           "between the ranks drops rdma_cm traffic"}));
  }
  while (auto event = mesh.events_->next(std::chrono::milliseconds(0))) {
    handleLazily(std::move(event));
  }
  startWaiting();
  return std::exchange(out, {});
}

// Lazy: every rank's address, from the launcher's fence or the store (one
// record per rank); the connector lives as long as the mesh.
void Mesh::startConnector(std::vector<std::optional<std::pair<std::string, uint16_t>>> addresses) {
  connector_.reset(new Connector{.mesh = *this, .addresses = std::move(addresses)});
  const auto n = static_cast<size_t>(size_);
  connector_->connectionView.assign(connections_.size(), nullptr);
  connector_->giveUpAt.assign(n, Connector::Clock::time_point{});
  connector_->lanesUp.assign(n, 0);
  connector_->failed.assign(n, false);
  connector_->lastProblem.assign(n, std::string());
  connector_->isWaiting.assign(n, false);
}

void Mesh::setLocalSlots(LocalSlots localSlots) {
  localSlots_ = std::move(localSlots);
}

void Mesh::dropWindows() {
  for (auto& c : connections_) {
    if (c) c->window = {};
  }
  if (connector_) {
    for (auto& [id, a] : connector_->attempts) a.window = {};
  }
}

void Mesh::connect(int peer) {
  if (connector_ && connects(peer)) connector_->connect(peer);
}

bool Mesh::connected(int peer) const {
  if (!connector_) return connects(peer);
  return connector_->lanesUp[static_cast<size_t>(peer)] == qpsPerPeer_;
}

MeshEvents Mesh::progressConnections() {
  if (!connector_) return {};
  return connector_->progress();
}

std::vector<int> Mesh::takeLazilyDisconnected() {
  return std::exchange(connector_->disconnected, {});
}

void Mesh::establishEarly(int peer) {
  if (!connector_) return;
  auto& attempts = connector_->attempts;
  for (auto it = attempts.begin(); it != attempts.end();) {
    if (it->second.role == Connector::Role::Passive && it->second.peer == peer && it->second.qp) {
      connector_->finish(it->second);
      it = attempts.erase(it);
    } else {
      ++it;
    }
  }
  connector_->noteConnecting();
}

bool Mesh::retrying() const {
  return connector_ && !connector_->retries.empty();
}

void Mesh::DropConnector::operator()(Connector* connector) const {
  delete connector;
}

}  // namespace rdmacc
