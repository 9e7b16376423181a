// Where a group's peers are and what reaches them: shared memory on this
// host, RDMA to the others over the group's own meshes (one per rail) or
// over connections an earlier group of the process shares
// (docs/decisions/009, 010, 011 and 019).
#include <cstdlib>
#include <string_view>

#include "rdmacc/environment.hpp"
#include "src/backend/shared_links.hpp"
#include "src/backend/verbs_backend_impl.hpp"
#include "src/bootstrap/host_identity.hpp"
#include "src/core/on_failure.hpp"
#include "src/store/auth.hpp"
#include "src/transport/shm/transport.hpp"

namespace rdmacc {
namespace {

// RDMACC_CONNECT=auto: groups up to this size connect every pair at formation
// (a few queue pairs, and the RDMA one-shot board needs them all); larger
// ones connect a pair when an operation first needs it.
constexpr int kEagerConnectRanks = 8;

}  // namespace

// One mesh per rail (RDMACC_IB_RAILS), each on its own port; the first
// keeps the group's name, so one rail is what it always was. Connections on
// first use above a handful of ranks (docs/decisions/010).
void VerbsBackend::Impl::makeRails(const Options& options, const std::vector<bool>& skip,
                                   bool defer) {
  const int railCount = static_cast<int>(config.getInt("RDMACC_IB_RAILS"));
  std::vector<std::optional<Endpoint>> endpoints(1);
  if (railCount > 1) {
    auto chosen = selectEndpoints(config, localRankFromEnvironment(), railCount);
    endpoints.assign(chosen.begin(), chosen.end());
  }
  for (size_t i = 0; i < endpoints.size(); ++i) {
    rails.push_back(std::make_shared<Mesh>(
        *store, rank, size, config,
        MeshOptions{.group = i == 0 ? group : fmt::format("{}/rail{}", group, i),
                    .skip = skip,
                    .endpoint = endpoints[i],
                    .lazy = lazyConnections(),
                    .allGather = options.allGather,
                    .deferStart = defer,
                    .transportConnects = true}));
  }
}

// The device tests fail one rank's formation on purpose
// (RDMACC_TEST_FAIL_FORMATION=STEP:GROUP): "exchanged" after the host
// records were exchanged, before the group chose its connections, "placed"
// right after the choice. What the group's peers and the connections they
// share see then is only testable end to end, and nothing else fails one
// rank there at will. From the environment, not the configuration: no
// user sets it, and docs/configuration.md does not list it.
void VerbsBackend::Impl::failFormationForTest(std::string_view step) const {
  const char* value = std::getenv("RDMACC_TEST_FAIL_FORMATION");
  if (value == nullptr || fmt::format("{}:{}", step, group) != value) return;
  throw Error(ErrorKind::Internal, fmt::format("group {}: formation failed on purpose once {} "
                                               "(RDMACC_TEST_FAIL_FORMATION)",
                                               group, step));
}

bool VerbsBackend::Impl::lazyConnections() const {
  const std::string& connect = config.getString("RDMACC_CONNECT");
  return connect == "lazy" || (connect == "auto" && size > kEagerConnectRanks);
}

// Shared memory to the ranks on this host, RDMA to the others
// (RDMACC_TRANSPORT=auto); the meshes only when some peer needs RDMA. One
// record per rank says all of it (docs/decisions/009 and 011).
VerbsBackend::Impl::Placement VerbsBackend::Impl::placePeers(const Options& options) {
  const std::string& transport = config.getString("RDMACC_TRANSPORT");
  // When the group surely needs RDMA (RDMACC_TRANSPORT=rdma, or more ranks
  // than the launcher put on this host), the meshes listen before the host
  // exchange and their addresses travel with the host records.
  const int localSize = localSizeFromEnvironment();
  const int railCount = static_cast<int>(config.getInt("RDMACC_IB_RAILS"));
  const bool share = config.getBool("RDMACC_SHARE_CONNECTIONS") && railCount == 1;
  Placement p;
  p.suits = fmt::format("{} {} {} {} {}", transport, config.getString("RDMACC_HOST_ID"),
                        config.getInt("RDMACC_SLOTS_PER_PEER"), config.getInt("RDMACC_SLOT_BYTES"),
                        auth::loadKey(config));
  LinkOffers offers = offerLinks(share, p.suits, rank == 0, size);
  OnFailure retire([&offers] { retireBoards(offers); });
  // A process with connections to share skips it: the group may not need
  // a mesh of its own.
  if (offers.held.empty() &&
      (transport == "rdma" || (transport == "auto" && localSize > 0 && size > localSize))) {
    makeRails(options, {}, /*defer=*/true);
  }
  std::string rdmaRecord;
  for (const auto& mesh : rails) {
    const std::string r = mesh->record();
    rdmaRecord += (rdmaRecord.empty() ? "" : " ") + (r.empty() ? "-" : r);
  }
  // The shared-memory segment's name is drawn now and travels with the
  // host record too.
  p.segment = newSegmentName();
  p.segmentFile = std::make_shared<net::Fd>(createSegmentFile(p.segment));
  std::vector<std::vector<std::string>> carried;
  hosts = algorithms::Hosts(
      hostNumbers(*store, options.allGather, group, rank, size,
                  hostIdentity(config.getString("RDMACC_HOST_ID")),
                  fmt::format("RDMACC_TRANSPORT={} RDMACC_IB_RAILS={} RDMACC_CONNECT={} "
                              "RDMACC_SHARE_CONNECTIONS={}",
                              transport, railCount, lazyConnections() ? "lazy" : "eager",
                              config.getBool("RDMACC_SHARE_CONNECTIONS") ? 1 : 0),
                  {segmentRecord(p.segment, p.segmentFile->get()),
                   rdmaRecord.empty() ? "-" : rdmaRecord, offers.line},
                  &carried));
  for (const auto& lines : carried) p.shmRecords.push_back(lines[0]);
  failFormationForTest("exchanged");
  p.shm.assign(static_cast<size_t>(size), false);
  std::vector<int> remote;
  for (int peer = 0; peer < size; ++peer) {
    if (peer == rank) continue;
    p.shm[static_cast<size_t>(peer)] = transport != "rdma" && hosts.host(peer) == hosts.host(rank);
    if (!p.shm[static_cast<size_t>(peer)]) remote.push_back(peer);
  }
  p.rdmaPeers = remote.size();
  if (transport == "shm" && !remote.empty()) {
    invalid(fmt::format("RDMACC_TRANSPORT=shm, but rank(s) {} are on other hosts",
                        fmt::join(remote, ", ")),
            "use RDMACC_TRANSPORT=auto (shared memory inside a host, RDMA between hosts)");
  }
  // Every rank reads the same records, so all take the same branch: RDMA is
  // needed by all or by none (auto: several hosts), and the addresses came
  // with the records only if every rank published them.
  if (remote.empty() && transport != "rdma") {
    rails.clear();
    return p;
  }
  std::vector<std::string> offered;
  for (const auto& lines : carried) offered.push_back(lines[2]);
  auto attach = chooseLink(offers, offered, rank);
  // Decided, the same on every member: no peer writes the regions of the
  // links not chosen, and the chosen one's is the claim's from here.
  offers.held.clear();
  if (attach) {
    // Every member took the same decision from the same records: no mesh.
    rails.clear();
    link = std::move(attach->link);
    linkMesh = std::move(attach->mesh);
    p.channel = attach->channel;
    p.toBase = std::move(attach->toBase);
    p.board = std::move(attach->board);
    p.claim = std::make_shared<ChannelClaim>(link, p.channel, p.toBase, Link::groupTag(group),
                                             p.board ? p.board->mine.keep : nullptr);
    return p;
  }
  p.linkId = foundingLinkId(offered);
  if (rails.empty()) {
    makeRails(options, p.shm, /*defer=*/false);
  } else {
    startRails(p.shm, carried);
  }
  return p;
}

// The deferred meshes, with every rank's addresses from the host records
// (line 2 of the carried lines: one field per rail, "-" for none), or
// through the store when some rank published none.
void VerbsBackend::Impl::startRails(const std::vector<bool>& shm,
                                    const std::vector<std::vector<std::string>>& carried) {
  std::vector<std::vector<std::string>> published(rails.size());
  for (int peer = 0; peer < size; ++peer) {
    const auto fields = splitFields(carried[static_cast<size_t>(peer)][1], ' ');
    for (size_t i = 0; i < published.size(); ++i) {
      if (fields.size() == published.size() && fields[i] != "-") {
        published[i].emplace_back(fields[i]);
      }
    }
  }
  for (size_t i = 0; i < rails.size(); ++i) {
    if (published[i].size() != static_cast<size_t>(size)) published[i].clear();
    rails[i]->start(*store, shm, published[i]);
  }
}

// The group's way to its RDMA peers besides its own rails: a channel of
// the link it attached to, or (founding one) its one rail's transport
// handed to a new link that later groups of the process may attach to.
RdmaPath VerbsBackend::Impl::rdmaPath(const Placement& placement) {
  RdmaPath path;
  if (link) {
    path.channel = link->open(placement.channel, rank, placement.toBase, Link::groupTag(group),
                              placement.board);
    placement.claim->opened();
    return path;
  }
  if (placement.linkId.empty() || rails.size() != 1) return path;
  path.share = [this, &placement](std::unique_ptr<Transport> made) {
    auto founded = std::make_shared<Link>(
        std::move(made), rank, size, static_cast<size_t>(config.getInt("RDMACC_UNEXPECTED_BYTES")),
        rails[0]);
    addLink(placement.linkId, placement.suits, founded, rails[0]);
    std::vector<int> identity(static_cast<size_t>(size));
    for (int r = 0; r < size; ++r) identity[static_cast<size_t>(r)] = r;
    return founded->open(0, rank, std::move(identity), Link::groupTag(group));
  };
  return path;
}

std::vector<Mesh*> VerbsBackend::Impl::meshesUsed() const {
  std::vector<Mesh*> meshes;
  for (const auto& mesh : rails) meshes.push_back(mesh.get());
  if (linkMesh) meshes.push_back(linkMesh.get());
  return meshes;
}

}  // namespace rdmacc
