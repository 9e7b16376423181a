#include "src/engine/blame.hpp"

#include <charconv>
#include <set>

#include <fmt/format.h>

namespace rdmacc {

std::optional<std::vector<int>> parseRanks(std::string_view text, int size) {
  std::vector<int> out;
  if (text.empty()) return out;
  if (text.size() > 16 * static_cast<size_t>(size)) return std::nullopt;
  const char* p = text.data();
  const char* end = p + text.size();
  while (true) {
    int r = -1;
    auto [next, ec] = std::from_chars(p, end, r);
    if (ec != std::errc() || r < 0 || r >= size) return std::nullopt;
    out.push_back(r);
    p = next;
    if (p == end) return out;
    if (*p != ',' || ++p == end) return std::nullopt;  // "1;2", "1,"
  }
}

std::string formatRanks(const std::vector<int>& ranks, size_t maxBytes) {
  std::string out;
  for (int r : ranks) {
    std::string item = out.empty() ? fmt::format("{}", r) : fmt::format(",{}", r);
    if (out.size() + item.size() > maxBytes) break;
    out += item;
  }
  return out;
}

StuckSearch::StuckSearch(int rank, int size, std::vector<int> awaited, Clock::time_point deadline)
    : rank_(rank),
      awaited_(std::move(awaited)),
      deadline_(deadline),
      reported_(size, false),
      reports_(size) {}

void StuckSearch::report(int peer, std::optional<std::vector<int>> waitsFor) {
  if (peer < 0 || peer >= reported_.size() || peer == rank_) return;
  if (reported_[peer]) return;
  reported_[peer] = true;
  reports_[peer] = std::move(waitsFor);
}

std::optional<std::vector<int>> StuckSearch::conclusion(Clock::time_point now) const {
  const bool final = now >= deadline_;
  std::set<int> ends;
  std::vector<bool> visited(reported_.size(), false);
  visited[static_cast<size_t>(rank_)] = true;
  std::vector<int> pending(awaited_.rbegin(), awaited_.rend());
  while (!pending.empty()) {
    const int r = pending.back();
    pending.pop_back();
    if (r < 0 || static_cast<size_t>(r) >= visited.size() || visited[static_cast<size_t>(r)]) {
      continue;  // seen: a cycle
    }
    visited[static_cast<size_t>(r)] = true;
    if (!reported_[r]) {
      if (!final) return std::nullopt;  // it may still answer
      ends.insert(r);
      continue;
    }
    const auto& next = reports_[r];
    if (!next || next->empty()) {  // corrupt, or waits for nobody: it is the end
      ends.insert(r);
      continue;
    }
    for (auto it = next->rbegin(); it != next->rend(); ++it) pending.push_back(*it);
  }
  return std::vector<int>(ends.begin(), ends.end());
}

}  // namespace rdmacc
