// The store server's commands: Set, Get, Add, Check, Wait, Delete and
// MultiGet against the key-value map, within the memory budget; a Get or
// Wait whose keys are missing blocks its client until a mutation of one of
// them wakes it.
#include <algorithm>

#include <fmt/format.h>

#include "rdmacc/error.hpp"
#include "src/store/server_state.hpp"
#include "src/store/store_util.hpp"

namespace rdmacc {

// The bytes a Get or MultiGet reply holds (keys present), else 0.
size_t TCPStoreServer::State::replyBytes(const sp::Request& req) const {
  if (req.command != sp::Command::Get && req.command != sp::Command::MultiGet) return 0;
  size_t total = 0;
  for (const auto& k : req.keys) {
    auto it = data.find(k);
    if (it != data.end()) total += 4 + it->second.size();
  }
  return total;
}

TCPStoreServer::State::Outcome TCPStoreServer::State::execute(const sp::Request& req, Client& c) {
  if (!ready(req)) {
    if (req.command == sp::Command::Get || req.command == sp::Command::Wait ||
        req.command == sp::Command::MultiGet) {
      return Outcome::NeedKeys;
    }
  }
  // Replies wait while those of other clients hold the budget; one that
  // is alone may exceed it (a value can be as large as the protocol allows).
  if (const size_t reply = replyBytes(req);
      reply > 0 && outputHeld > 0 && outputHeld + reply > limits.memoryBudget) {
    return Outcome::NeedRoom;
  }
  sp::Response resp;
  auto refuse = [&](std::string why) {
    resp.status = sp::Status::Error;
    resp.error = std::move(why);
  };
  // Room for `bytes` more stored bytes, or an error reply naming the budget.
  auto fits = [&](size_t freed, size_t added) {
    if (storedBytes - freed + added <= limits.memoryBudget) return true;
    refuse(
        fmt::format("the store is full: it holds {} bytes and its budget is {} "
                    "(RDMACC_STORE_MEMORY of the process hosting it); {} more do not fit",
                    storedBytes, limits.memoryBudget, added - std::min(added, freed)));
    return false;
  };
  switch (req.command) {
    case sp::Command::Set: {
      auto it = data.find(req.keys[0]);
      const size_t freed = it == data.end() ? 0 : req.keys[0].size() + it->second.size();
      const size_t added = req.keys[0].size() + req.value.size();
      if (!fits(freed, added)) break;
      data[req.keys[0]] = req.value;
      storedBytes = storedBytes - freed + added;
      break;
    }
    case sp::Command::Get:
      resp.value = data[req.keys[0]];
      break;
    case sp::Command::Add: {
      auto it = data.find(req.keys[0]);
      const size_t freed = it == data.end() ? 0 : req.keys[0].size() + it->second.size();
      int64_t v = 0;
      try {
        v = counterAdd(it == data.end() ? nullptr : &it->second, req.delta, req.keys[0]);
      } catch (const Error& e) {
        refuse(e.info().message);
        break;
      }
      std::string text = std::to_string(v);
      if (!fits(freed, req.keys[0].size() + text.size())) break;
      data[req.keys[0]] = Bytes(text.begin(), text.end());
      storedBytes = storedBytes - freed + req.keys[0].size() + text.size();
      sp::putI64(resp.value, v);
      break;
    }
    case sp::Command::Check:
      resp.value.push_back(ready(req) ? 1 : 0);
      break;
    case sp::Command::Wait:
      break;
    case sp::Command::Delete: {
      auto it = data.find(req.keys[0]);
      const bool existed = it != data.end();
      if (existed) {
        storedBytes -= req.keys[0].size() + it->second.size();
        data.erase(it);
      }
      resp.value.push_back(existed ? 1 : 0);
      break;
    }
    case sp::Command::MultiGet: {
      size_t total = 0;
      for (const auto& k : req.keys) total += 4 + data[k].size();
      if (total > sp::kMaxValueBytes) {
        refuse(fmt::format("multiGet of {} keys would return {} bytes (the limit is {})",
                           req.keys.size(), total, sp::kMaxValueBytes));
        break;
      }
      resp.value.reserve(total);
      for (const auto& k : req.keys) {
        const Bytes& v = data[k];
        sp::putU32(resp.value, static_cast<uint32_t>(v.size()));
        resp.value.insert(resp.value.end(), v.begin(), v.end());
      }
      break;
    }
  }
  queue(c, sp::encode(resp));
  return Outcome::Done;
}

void TCPStoreServer::State::block(uint64_t id, Client& c, sp::Request req) {
  c.blocked = true;
  c.pending = std::move(req);
  c.present = 0;
  ready(c.pending, c.present);
  for (const auto& k : c.pending.keys) waiters.emplace(k, id);
}

void TCPStoreServer::State::unblock(uint64_t id, Client& c) {
  for (const auto& k : c.pending.keys) {
    auto [lo, hi] = waiters.equal_range(k);
    for (auto it = lo; it != hi; ++it) {
      if (it->second == id) {
        waiters.erase(it);
        break;
      }
    }
  }
  c.blocked = false;
  c.pending = sp::Request{};
}

// After a mutation of `key`: the clients waiting for it look again.
void TCPStoreServer::State::mutated(const std::string& key, bool deleted) {
  auto [lo, hi] = waiters.equal_range(key);
  for (auto it = lo; it != hi; ++it) {
    auto c = clients.find(it->second);
    if (c == clients.end()) continue;
    if (deleted) c->second.present = 0;
    woken.push_back(it->second);
  }
}
}  // namespace rdmacc
