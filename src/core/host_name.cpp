// hostName() (rdmacc/environment.hpp) lives in core because the log's %h
// expansion needs it, and core may not include the bootstrap it belongs to.
#include <unistd.h>

#include <array>
#include <string>

#include "rdmacc/environment.hpp"

namespace rdmacc {

std::string hostName() {
  std::array<char, 256> host{};
  if (::gethostname(host.data(), host.size() - 1) != 0) return "";
  return host.data();
}

}  // namespace rdmacc
