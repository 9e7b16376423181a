// Pieces shared by the Store implementations.
#pragma once

#include <chrono>
#include <map>
#include <string>
#include <vector>

#include "rdmacc/error.hpp"
#include "rdmacc/store.hpp"

namespace rdmacc {

// The Error a store raises when keys did not appear in time; names them.
Error storeTimeout(const char* what, const std::vector<std::string>& missing,
                   std::chrono::milliseconds timeout, const std::string& where);
// The keys of `keys` that `data` lacks, in order.
std::vector<std::string> missingKeys(const std::map<std::string, Bytes>& data,
                                     const std::vector<std::string>& keys);
// The integer held by a counter key (c10d stores counters as decimal text).
int64_t counterValue(const Bytes& value, const std::string& key);

}  // namespace rdmacc
