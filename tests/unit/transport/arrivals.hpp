// What a channel's poll delivered, for tests that poll channels themselves
// (the Link tests over a FakeNetwork, the device tests over real verbs).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "rdmacc/error.hpp"
#include "src/transport/transport.hpp"

namespace rdmacc::testing {

// What a channel's poll delivered, for tests that poll channels themselves.
struct Arrivals final : TransportSink {
  std::vector<std::pair<int, Incoming>> got;
  std::vector<std::pair<int, std::string>> failures;
  void arrived(int peer, const Incoming& in) override { got.emplace_back(peer, in); }
  void failed(int peer, Error error) override { failures.emplace_back(peer, error.what()); }
};

}  // namespace rdmacc::testing
