#include "rdmacc/version.hpp"

namespace rdmacc {

const char* version() noexcept {
  return RDMACC_VERSION;
}

}  // namespace rdmacc
