// A mesh's connection to one peer (one queue pair): shared by mesh.cpp and
// the handshake (mesh_connector.hpp), private to them.
#pragma once

#include "src/transport/rdma/mesh.hpp"

namespace rdmacc {

struct Mesh::Connection {
  verbs::CmIdPtr id;  // the QP below is destroyed first
  verbs::QpPtr qp;
  ReceiveShare receives;  // of the queue pair above
  verbs::Window window;   // lazy, Mesh::windows: over our slots, bound to qp; before qp goes
  int pathMtu = 0;
  SlotAdvert remote;  // lazy: the peer's slots for this rank, from its hello
};

}  // namespace rdmacc
