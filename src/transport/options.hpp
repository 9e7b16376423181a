// What a transport is built with (backend/transports.cpp makes them from
// the option table): the group, this rank's place in it, slot geometry and
// each transport's own switches. The engine's options are its own
// (engine/engine.hpp): a transport never sees them, so a test can hand the
// engine any Transport.
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "rdmacc/store.hpp"

namespace rdmacc {

class RegistrationCache;
namespace net {
class Fd;
}

struct TransportOptions {
  std::string group;
  int rank = 0;
  int size = 1;
  // By rank: the peers reached through shared memory (transport/shm/);
  // the others through the RDMA rails. Empty: every peer through RDMA.
  std::vector<bool> sharedMemoryPeers;
  // The launcher's exchange for the shared-memory segments' records when
  // they did not come with the host records; empty: the store's set and
  // multiGet.
  AllGather allGather;
  // How long formation waits for a peer (RDMACC_CONNECT_TIMEOUT): e.g. for
  // every local peer to map this rank's shared-memory segment.
  std::chrono::milliseconds connectTimeout{60'000};
  // Shared memory: this rank's segment name (newSegmentName), its file
  // (createSegmentFile) and, by rank, every rank's "name:pid:fd", when the
  // backend exchanged them with the host records; empty: the transport
  // makes its own and exchanges them itself.
  std::string shmSegment;
  std::shared_ptr<net::Fd> shmSegmentFile;
  std::vector<std::string> shmRecords;
  // Resources per peer on first use (RDMACC_CONNECT): RDMA connections, and
  // a rank's slots in a local peer's shared-memory segment.
  bool lazy = false;
  int slotsPerPeer = 16;
  // 0: autoSlotBytes(world size, slotsPerPeer) (transport/rdma/transport.hpp).
  size_t slotBytes = 0;
  // RDMA: payloads of at least zeroCopyMinBytes in memory the user
  // registered (the sending operation's ZeroCopyWrites::registrations, made
  // in this transport's protection domain) are sent from it without the
  // staging copy. False: always copy (a rail other than the one the
  // registrations were made for).
  bool zeroCopy = false;
  size_t zeroCopyMinBytes = 16384;
  // Shared memory: receives of at least zeroCopyMinBytes are advertised to
  // local peers, which write them in place with one copy (process_vm_writev)
  // where the kernel permits (RDMACC_SHM_SINGLE_COPY).
  bool shmSingleCopy = true;
  // Shared memory: register for membarrier(GLOBAL_EXPEDITED) so that local
  // senders need no fence before reading a peer's sleeping flag
  // (RDMACC_SHM_MEMBARRIER; ShmTransport::publishFence).
  bool shmMembarrier = true;
  // Shared memory, every peer on this host: allreduces up to this many bytes
  // are one-shot through the board (transport/transport.hpp, Board). 0: never.
  size_t shmOneShotBytes = 4096;
  // RDMA, one rail carrying every peer: allreduces up to this many bytes
  // (and what one inline write carries) are one-shot through the RDMA board.
  // 0: never. Every rank must offer one for the group to have it.
  size_t rdmaOneShotBytes = 64;
};

}  // namespace rdmacc
