// A group of the job rdmacc-run started, formed from its environment: named,
// so that the several groups of one test binary keep apart in the store, and
// with explicit RDMACC_* settings above the environment's.
#pragma once

#include <map>
#include <memory>
#include <string>

#include "rdmacc/backend.hpp"

namespace rdmacc::test {

inline std::shared_ptr<VerbsBackend> groupFromEnvironment(
    const std::string& name, std::map<std::string, std::string> config = {}) {
  VerbsBackend::Options options;
  options.groupName = name;
  options.config = std::move(config);
  return initFromEnvironment(options);
}

}  // namespace rdmacc::test
