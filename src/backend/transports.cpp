#include "src/backend/transports.hpp"

#include <fmt/format.h>

#include "rdmacc/error.hpp"
#include "src/transport/composite.hpp"
#include "src/transport/rdma/transport.hpp"
#include "src/transport/shm/transport.hpp"
#include "src/transport/wire.hpp"

namespace rdmacc {

std::unique_ptr<Transport> makeTransports(const std::vector<Mesh*>& rails, Store& store,
                                          TransportOptions options, RdmaPath rdma) {
  if (options.slotBytes == 0) options.slotBytes = autoSlotBytes(options.size, options.slotsPerPeer);
  if (options.slotBytes < 2 * wire::kHeaderBytes || options.slotBytes % 64 != 0 ||
      options.slotBytes > (1u << 30)) {
    throw Error(
        ErrorKind::InvalidArgument, fmt::format("slot size {} is not usable", options.slotBytes),
        "RDMACC_SLOT_BYTES must be 0 (automatic) or a multiple of 64 between 128 and 1 GiB");
  }
  auto& shm = options.sharedMemoryPeers;
  if (shm.empty()) shm.assign(static_cast<size_t>(options.size), false);
  bool anyShm = false, anyRdma = false;
  for (int peer = 0; peer < options.size; ++peer) {
    if (peer == options.rank) continue;
    (shm[static_cast<size_t>(peer)] ? anyShm : anyRdma) = true;
  }
  if (rails.empty() && !rdma.channel) {
    if (anyRdma) {
      throw Error(ErrorKind::Internal, "peers on other hosts, but no connection mesh to them");
    }
    return makeShmTransport(store, options, shm);
  }
  std::vector<std::unique_ptr<Transport>> children;
  if (rdma.channel) children.push_back(std::move(rdma.channel));
  for (size_t i = 0; i < rails.size(); ++i) {
    TransportOptions rail = options;
    if (i > 0) {  // its own slot regions in the store; zero-copy on the first rail only
      rail.group += fmt::format("/rail{}", i);
      rail.zeroCopy = false;
    }
    // The board: only where this transport will carry every peer.
    if (rails.size() > 1 || anyShm) rail.rdmaOneShotBytes = 0;
    children.push_back(makeRdmaTransport(*rails[i], store, rail));
  }
  if (rdma.share && children.size() == 1) children[0] = rdma.share(std::move(children[0]));
  if (children.size() == 1 && !anyShm) return std::move(children[0]);
  const size_t railCount = children.size();
  std::vector<uint8_t> striped(railCount);
  for (size_t i = 0; i < striped.size(); ++i) striped[i] = static_cast<uint8_t>(i);
  std::vector<std::vector<uint8_t>> carriers(static_cast<size_t>(options.size));
  for (int peer = 0; peer < options.size; ++peer) {
    if (peer == options.rank) continue;
    carriers[static_cast<size_t>(peer)] =
        shm[static_cast<size_t>(peer)] ? std::vector<uint8_t>{static_cast<uint8_t>(railCount)}
                                       : striped;
  }
  if (anyShm) children.push_back(makeShmTransport(store, options, shm));
  return makeCompositeTransport(std::move(children), std::move(carriers));
}

}  // namespace rdmacc
