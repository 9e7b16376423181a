// Pieces shared by the Store implementations.
#pragma once

#include <chrono>
#include <map>
#include <string>
#include <string_view>
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
// add(): the counter's new value (current null: the key is new), in checked
// arithmetic: Error(Store) when it is not an integer or would overflow int64.
int64_t counterAdd(const Bytes* current, int64_t delta, const std::string& key);
// A decimal number another rank published in the store (a port, a token, a
// sequence number): Error(Protocol) naming the key and what it holds unless
// it is all digits and at most `max`.
uint64_t storeNumber(std::string_view text, uint64_t max, const std::string& key);
uint64_t storeNumber(const Bytes& value, uint64_t max, const std::string& key);
// Publishes `mine` as this rank's record under `prefix` and returns the
// records of `wanted` (in order): through `allGather` when there is one
// (every rank of `participants` calls this with the same prefix), else
// through the store, a set of prefix/<rank> and one multiGet.
std::vector<Bytes> exchangeRecords(Store& store, const AllGather& allGather,
                                   const std::string& prefix, int rank, const Bytes& mine,
                                   const std::vector<int>& participants,
                                   const std::vector<int>& wanted);
// The fields of a value another rank published ("a:b:c"), empty ones included.
std::vector<std::string_view> splitFields(std::string_view text, char separator);

}  // namespace rdmacc
