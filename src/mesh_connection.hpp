// A mesh's connection to one peer (one queue pair): shared by mesh.cpp and
// mesh_setup.cpp, private to them.
#pragma once

#include "src/mesh.hpp"

namespace rdmacc {

struct Mesh::Connection {
  verbs::CmIdPtr id;  // the QP below is destroyed first
  verbs::QpPtr qp;
  int pathMtu = 0;
};

}  // namespace rdmacc
