// The mesh's handshake state, private to src/transport/rdma/mesh*.cpp:
// mesh_connector.cpp runs the rdma_cm handshake both ways (hellos, accept,
// reject, retry), mesh_eager.cpp connects every peer at formation and
// mesh_lazy.cpp connects a peer on first use (docs/decisions/010).
#pragma once

#include <array>
#include <chrono>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "src/transport/rdma/handshake.hpp"
#include "src/transport/rdma/mesh_connection.hpp"

namespace rdmacc {

// Alive while the mesh forms (eager) or as long as the mesh (lazy).
struct Mesh::Connector {
  using Clock = std::chrono::steady_clock;
  using Address = std::optional<std::pair<std::string, uint16_t>>;
  enum class Role { Active, Passive };
  struct Attempt {
    Role role;
    int peer;
    int qpIndex;
    verbs::CmIdPtr id;
    verbs::QpPtr qp;
    ReceiveShare receives;  // of qp
    verbs::Window window;   // see Connection::window
    SlotRegion mine;        // what our hello gave (Mesh::setLocalSlots)
    int pathMtu = 0;
    SlotAdvert remote;
  };

  Mesh& mesh;
  Store* store = nullptr;  // eager formation only: the progress thread never uses it
  Clock::time_point deadline{};
  std::vector<Address> addresses;  // eager: of the lower ranks, once published
  std::map<rdma_cm_id*, Attempt> attempts;
  std::vector<std::pair<Clock::time_point, std::pair<int, int>>> retries;  // (when, (peer, qp))
  int connected = 0;
  std::vector<Connection*> connectionView;  // [peer * qpsPerPeer + q], as mesh.connections_
  // Lazy, by peer: when connecting gives up (time_point{}: not trying),
  // queue pairs up, reported failed; what happened since the last look.
  std::vector<Clock::time_point> giveUpAt;
  std::vector<int> lanesUp;
  std::vector<bool> failed;
  std::vector<std::string> lastProblem;
  // Lazy: peers to connect to once fewer than Mesh::connectWindow_ of this
  // rank's own attempts are under way (startWaiting), and whether each is here.
  std::vector<int> waiting;
  std::vector<bool> isWaiting;
  MeshEvents out;
  std::vector<int> disconnected;
  // Eager: looking up the lower ranks' addresses (mesh_eager.cpp).
  bool addressesKnown = false;
  Clock::time_point nextAddressPoll{};

  Connection*& slot(int peer, int q) {
    return connectionView[static_cast<size_t>(peer * mesh.qpsPerPeer_ + q)];
  }
  int needed() const { return mesh.connectedPeers() * mesh.qpsPerPeer_; }
  bool skipped(int peer) const { return mesh.skip_[peer]; }
  // Whether attempts or retries are under way (Mesh::connecting()).
  void noteConnecting() {
    mesh.connecting_ = !attempts.empty() || !retries.empty() || !waiting.empty();
  }
  // Lazy: peers this rank's own attempts or retries are for.
  int activePeers() const;
  // Lazy: starts waiting peers, nearest below this rank first (a ring
  // distance), while the window has room.
  void startWaiting();
  void start(int peer);

  // The handshake, both roles (mesh_connector.cpp).
  // The hello on a's queue pair (lazy: with our slots, and with windows a
  // new window's rkey); expose binds that window once the queue pair can
  // send, before the peer can write.
  std::array<uint8_t, handshake::kHelloBytes> hello(Attempt& a, handshake::Direction direction);
  void expose(Attempt& a);
  handshake::Expectation expect(handshake::Direction direction, const rdma_cm_event* event,
                                int minPeer, int maxPeer) const;
  verbs::QpParams paramsFor(int remoteMtu) const;
  // The attempt's queue pair, in INIT with its receives posted.
  void makeQp(Attempt& a);
  void finish(Attempt& a);
  void startActive(int peer, int q);
  void onConnectRequest(rdma_cm_event* event, std::vector<verbs::CmIdPtr>& discard);
  void onActiveEvent(Attempt& a, rdma_cm_event* event, bool& drop);
  void onConnectResponse(Attempt& a, rdma_cm_event* event);
  bool onRejected(Attempt& a, rdma_cm_event* event);
  void onPassiveEvent(Attempt& a, rdma_cm_event* event, bool& drop);
  void onEstablishedEvent(rdma_cm_event* event);
  void handle(verbs::CmEventPtr event);

  // Eager formation (mesh_eager.cpp).
  static const char* const kMissingHint;  // for a group that does not form
  void run();
  void lookUpAddresses();
  // The ranks not (fully) connected yet: never published an address, or did
  // but did not connect; `what` describes them for an error message.
  struct Missing {
    std::vector<int> absent, ranks;
    std::string what;
  };
  Missing missing();
  [[noreturn]] void timeout();
  void checkAbort();

  // Connecting on first use (mesh_lazy.cpp).
  void connect(int peer);
  bool busy(int peer, int q);
  void fail(int peer, Error error);
  void dropAttempts(int peer);
  std::optional<handshake::RejectReason> crossed(int peer, int q,
                                                 std::vector<verbs::CmIdPtr>& discard);
  void handleLazily(verbs::CmEventPtr event);
  MeshEvents progress();
};

}  // namespace rdmacc
