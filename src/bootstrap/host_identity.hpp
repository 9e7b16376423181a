// Which ranks of a group share a host, in the sense that matters for shared
// memory: the same running kernel (boot id), the same mount namespace
// (the wake-up sockets' directory in /tmp), network namespace and pid
// namespace (a peer's segment is opened through /proc/PID/fd, its process
// watched). Every rank publishes its identity
// and reads the others' (through the launcher's exchange, or the store).
#pragma once

#include <string>
#include <vector>

#include "rdmacc/store.hpp"

namespace rdmacc {

// This process's identity: "hostname/boot-id/mnt:[..]/net:[..]/pid:[..]", or
// `override` when it is not empty (RDMACC_HOST_ID: tests that pretend ranks
// of one machine are on several hosts).
std::string hostIdentity(const std::string& override);

// By rank: the number of that rank's host, hosts numbered from 0 in order of
// their lowest rank (ranks with equal identities share a number; this rank's
// host is hostOf[rank]). The same on every rank: all read the same identities.
// Publishes this rank's rdmacc and protocol versions, the settings every rank
// must share (`agreed`, "RDMACC_TRANSPORT=auto RDMACC_IB_RAILS=1": ranks that
// differ would wait for connections the others never make) and identity
// under the group's name and waits for every rank's; throws Error(Protocol)
// naming a rank whose protocol differs (both versions in the message) and
// Error(InvalidArgument) naming a rank whose settings differ.
// `allGather`: the launcher's exchange (PMIx), or empty for the store's.
// `carried` lines travel with the record (the backend's: shared memory's
// "name:pid" and the RDMA addresses; no newline, at most kCarriedLineBytes
// each); `carriedRecords`, unless null, receives every rank's, by rank.
constexpr size_t kCarriedLineBytes = 512;
std::vector<int> hostNumbers(Store& store, const AllGather& allGather, const std::string& group,
                             int rank, int size, const std::string& identity,
                             const std::string& agreed,
                             const std::vector<std::string>& carried = {},
                             std::vector<std::vector<std::string>>* carriedRecords = nullptr);

}  // namespace rdmacc
