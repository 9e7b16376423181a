// Where a rank's doorbell (the datagram socket its local peers wake it
// through) lives: a file in /tmp/rdmacc-<uid>, a directory only this user
// can enter (docs/security.md, "What a peer on the same host can write").
#pragma once

#include <sys/socket.h>
#include <sys/un.h>

#include <string>

namespace rdmacc::shm {

// Creates /tmp/rdmacc-<uid> (0700) or checks the one there: this user's, a
// directory (not a link), closed to group and others; throws an Error naming
// it otherwise. Removes doorbells that nobody holds any more (left by a crash).
void prepareDoorbellDirectory();

// The address of the doorbell of the rank whose segment is `name`
// ("/rdmacc-<pid>-<hex>"), and its length for bind/sendto.
sockaddr_un doorbellAddress(const std::string& name, socklen_t& length);

}  // namespace rdmacc::shm
