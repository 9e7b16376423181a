#include "src/blame.hpp"

#include <algorithm>
#include <charconv>
#include <optional>
#include <set>

#include <fmt/format.h>

#include "rdmacc/error.hpp"

namespace rdmacc {
namespace {

using Clock = std::chrono::steady_clock;

// "2,5" -> {2, 5}; nullopt unless every entry is a rank of the group.
std::optional<std::vector<int>> parseRanks(const std::string& text, int size) {
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

}  // namespace

std::vector<int> stuckOn(Store& store, const std::string& prefix, int rank, int size,
                         const std::vector<int>& awaited, std::chrono::milliseconds grace,
                         bool* storeAnswered) {
  if (storeAnswered != nullptr) *storeAnswered = true;
  auto key = [&](int r) { return fmt::format("{}/{}", prefix, r); };
  std::set<int> roots;
  const auto deadline = Clock::now() + grace;
  // Every call ends by the deadline, even when the store's host is the
  // stopped rank (its server frozen with it).
  const CallBudget budget(deadline);
  try {
    store.set(key(rank), toBytes(fmt::format("{}", fmt::join(awaited, ","))));
    std::set<int> visited{rank};
    std::vector<int> pending(awaited.rbegin(), awaited.rend());
    while (!pending.empty()) {
      const int r = pending.back();
      pending.pop_back();
      if (r < 0 || r >= size || !visited.insert(r).second) continue;  // seen: a cycle
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      bool reported = store.check({key(r)});
      if (!reported && left.count() > 0) {
        try {
          store.wait({key(r)}, left);
          reported = true;
        } catch (const Error& e) {
          if (e.kind() != ErrorKind::Timeout) throw;
        }
      }
      if (!reported) {
        roots.insert(r);
        continue;
      }
      const auto next = parseRanks(toString(store.get(key(r))), size);
      if (!next || next->empty()) {  // corrupt, or waits for nobody: it is the end
        roots.insert(r);
        continue;
      }
      for (auto it = next->rbegin(); it != next->rend(); ++it) pending.push_back(*it);
    }
  } catch (const Error&) {
    // best effort: the store may be what failed
    if (storeAnswered != nullptr) *storeAnswered = false;
  }
  return {roots.begin(), roots.end()};
}

}  // namespace rdmacc
