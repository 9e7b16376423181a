// The shared-memory transport, for peers on the same host (host_identity):
// every rank owns one segment (a memfd, mode 0600, sealed against shrinking
// and growing, its descriptor closed once its peers mapped it) holding, for each local peer, a
// single-producer ring of arrival records and that peer's staging slots. A message is one copy: the
// sender writes the header and payload into the receiver's slot and appends a
// record (the "immediate" of the RDMA transport: the slot, or a credit) to the
// receiver's ring. The slot and credit protocol and its validation are the
// RDMA transport's (SlotWindow, wire::): a peer's bytes are checked the same
// way whatever carried them. A sleeping receiver is woken through a datagram
// socket when a sender sees its sleeping flag; a peer whose process exited
// (pidfd) or whose transport went away (its segment's flag) is reported as
// disconnected.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "src/store/socket.hpp"

#include "rdmacc/store.hpp"
#include "src/transport/options.hpp"
#include "src/transport/transport.hpp"

namespace rdmacc {

// `peers`: by rank, the ranks this transport carries (same host; this
// rank's entry is ignored). options.slotBytes must be resolved (not 0).
// Throws Error when a segment cannot be created or mapped (e.g. too little
// memory, naming the bytes it needed).
std::unique_ptr<Transport> makeShmTransport(Store& store, const TransportOptions& options,
                                            const std::vector<bool>& peers);

// A fresh name for this rank's segment, "/rdmacc-<pid>-<random>": drawn
// before the group forms, so that it can travel with the host records
// (TransportOptions::shmSegment).
std::string newSegmentName();
// A name newSegmentName could have made (what a peer publishes is checked).
bool validSegmentName(std::string_view name);
// The file of this rank's segment: a memfd called `name`, 0600, empty and
// open to sealing (the transport sizes and seals it). Local peers open it
// as /proc/PID/fd/FD, so the descriptor's number travels in the rank's
// record with the name and pid ("name:pid:fd"); made before the group forms
// for that reason. Throws Error naming the call.
net::Fd createSegmentFile(const std::string& name);
// This rank's record for its local peers: "name:pid:fd".
std::string segmentRecord(const std::string& name, int fd);

}  // namespace rdmacc
