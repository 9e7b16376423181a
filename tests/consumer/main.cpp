// Uses the installed public API without a device: a store, a dtype table, the
// version; prints the version so the test can compare it.
#include <cstdio>
#include <cstring>

#include "rdmacc/config.hpp"  // std::span: needs C++20, which the target carries
#include "rdmacc/store.hpp"
#include "rdmacc/types.hpp"
#include "rdmacc/version.hpp"

int main() {
  rdmacc::HashStore store;
  store.set("k", rdmacc::toBytes("v"));
  if (rdmacc::toString(store.get("k")) != "v") return 1;
  if (rdmacc::elementSize(rdmacc::DataType::BFloat16) != 2) return 1;
  if (std::strcmp(rdmacc::version(), RDMACC_VERSION) != 0) return 1;
  std::printf("consumer uses rdmacc %s\n", rdmacc::version());
  return 0;
}
