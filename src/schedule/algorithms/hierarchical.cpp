// Hierarchical schedules: the ranks of each host first combine through their
// host (shared memory), one or more ranks per host talk across the network,
// and the result spreads inside each host again. Every phase is an ordinary
// schedule built for a subgroup's indices and mapped onto ranks; phases are
// padded with empty steps to the same length on every host, so that a
// message's step index (what the engine matches on) agrees between hosts
// whose rank counts differ.
#include <algorithm>
#include <functional>
#include <set>
#include <stdexcept>

#include "src/schedule/algorithms/algorithms.hpp"

namespace rdmacc::algorithms {

Hosts::Hosts(std::vector<int> hostOfRank) : hostOf(std::move(hostOfRank)) {
  for (size_t r = 0; r < hostOf.size(); ++r) {
    const int h = hostOf[r];
    if (h < 0 || static_cast<size_t>(h) > members.size()) {
      throw std::invalid_argument("hosts must be numbered from 0 in order of their lowest rank");
    }
    if (static_cast<size_t>(h) == members.size()) members.emplace_back();
    members[static_cast<size_t>(h)].push_back(static_cast<int>(r));
  }
}

Hosts Hosts::single(int size) {
  return Hosts(std::vector<int>(static_cast<size_t>(size), 0));
}

int Hosts::localIndex(int rank) const {
  const auto& m = members[static_cast<size_t>(host(rank))];
  return static_cast<int>(std::find(m.begin(), m.end(), rank) - m.begin());
}

size_t Hosts::largest() const {
  size_t most = 0;
  for (const auto& m : members) most = std::max(most, m.size());
  return most;
}

bool Hosts::contiguous() const {
  return std::all_of(members.begin(), members.end(), [](const auto& m) {
    return m.back() - m.front() + 1 == static_cast<int>(m.size());
  });
}

bool Hosts::uniform() const {
  return std::all_of(members.begin(), members.end(),
                     [&](const auto& m) { return m.size() == members.front().size(); });
}

namespace {

using Builder = std::function<Schedule(int index, int size)>;

// `sub` was built for a subgroup whose index i is rank members[i]: the same
// steps with peers as ranks.
Schedule onRanks(Schedule sub, const std::vector<int>& members) {
  for (Step& s : sub) {
    for (SendSpec& send : s.sends) send.peer = members[static_cast<size_t>(send.peer)];
    for (RecvSpec& recv : s.recvs) recv.peer = members[static_cast<size_t>(recv.peer)];
  }
  return sub;
}

// Appends one phase: this rank's part (empty when it takes no part) padded
// to `steps`, the phase's length on the host (or subgroup) where it is longest.
void append(Schedule& out, Schedule part, size_t steps) {
  part.resize(std::max(part.size(), steps));
  for (Step& s : part) out.push_back(std::move(s));
}

// The length of a phase that runs `build` in each of `groups`: every index of
// one subgroup has the same number of steps (the engine matches on them).
// Built once per distinct subgroup size, not once per host.
size_t longest(const std::vector<std::vector<int>>& groups, const Builder& build) {
  std::set<size_t> sizes;
  for (const auto& g : groups) {
    if (!g.empty()) sizes.insert(g.size());
  }
  size_t steps = 0;
  for (size_t n : sizes) steps = std::max(steps, build(0, static_cast<int>(n)).size());
  return steps;
}

// Runs `build` on each host's ranks (index = local index), padded.
void intraHost(Schedule& out, int rank, const Hosts& hosts, const Builder& build) {
  const auto& mine = hosts.members[static_cast<size_t>(hosts.host(rank))];
  append(out, onRanks(build(hosts.localIndex(rank), static_cast<int>(mine.size())), mine),
         longest(hosts.members, build));
}

// The first rank of each host, or `root` on its host.
std::vector<int> leaders(const Hosts& hosts, int root) {
  std::vector<int> out;
  for (const auto& m : hosts.members) out.push_back(m.front());
  if (root >= 0) out[static_cast<size_t>(hosts.host(root))] = root;
  return out;
}

// Runs `build` among `group` (one rank per host, index = host) if this rank
// is in it; everyone pads to its length.
void interHost(Schedule& out, int rank, const std::vector<int>& group, const Builder& build) {
  const int n = static_cast<int>(group.size());
  const auto at = std::find(group.begin(), group.end(), rank);
  Schedule part;
  if (at != group.end()) part = onRanks(build(static_cast<int>(at - group.begin()), n), group);
  append(out, std::move(part), build(0, n).size());
}

// A rank's parent and children in a tree whose top is a tree over the
// hosts' leaders (rooted at `root`'s host) and, below each leader, a tree
// over that host's ranks: one network hop per level of hosts, the rest
// inside hosts. Binomial trees (latency: log levels), or chains (`chain`:
// bandwidth, every rank forwards one copy per level, as the flat chain
// broadcast). Children that are leaders come first (their subtrees are the
// largest, and their copy crosses the network).
struct TreeLinks {
  int parent = -1;
  std::vector<int> children;
};
struct Shape {
  bool chain;
  int parent(int index, int size, int root) const {
    if (!chain) return binomialParent(index, size, root);
    const int v = (index - root + size) % size;
    return v == 0 ? -1 : (index - 1 + size) % size;
  }
  std::vector<int> children(int index, int size, int root) const {
    if (!chain) return binomialChildren(index, size, root);
    const int v = (index - root + size) % size;
    return v + 1 < size ? std::vector<int>{(index + 1) % size} : std::vector<int>{};
  }
};
TreeLinks hostTree(int rank, const Hosts& hosts, int root, Shape shape) {
  const std::vector<int> top = leaders(hosts, root);
  const int h = hosts.host(rank);
  const auto& mine = hosts.members[static_cast<size_t>(h)];
  const int leader = top[static_cast<size_t>(h)];
  const int H = static_cast<int>(top.size());
  const int L = static_cast<int>(mine.size());
  // Local tree rooted at the leader's local index.
  const int localRoot =
      static_cast<int>(std::find(mine.begin(), mine.end(), leader) - mine.begin());
  TreeLinks t;
  const int li = hosts.localIndex(rank);
  if (int p = shape.parent(li, L, localRoot); p >= 0) t.parent = mine[static_cast<size_t>(p)];
  if (rank == leader) {
    if (int p = shape.parent(h, H, hosts.host(root)); p >= 0)
      t.parent = top[static_cast<size_t>(p)];
    for (int c : shape.children(h, H, hosts.host(root)))
      t.children.push_back(top[static_cast<size_t>(c)]);
  }
  for (int c : shape.children(li, L, localRoot)) t.children.push_back(mine[static_cast<size_t>(c)]);
  return t;
}

}  // namespace

Schedule hierarchicalAllreduce(int rank, const Hosts& hosts, size_t count, size_t elementSize,
                               bool finalize, bool split) {
  const size_t bytes = count * elementSize;
  const int H = hosts.count();
  Schedule out;
  if (split && hosts.uniform() && hosts.largest() > 1) {
    // Every rank carries a share across the network: reduce-scatter inside
    // the host (local index j owns block j), allreduce block j among the
    // ranks of local index j of every host, allgather inside the host.
    const int L = static_cast<int>(hosts.largest());
    const auto blocks = evenBlocks(count, L, elementSize);
    intraHost(out, rank, hosts,
              [&](int i, int n) { return ringReduceScatter(i, n, blocks, false); });
    const int li = hosts.localIndex(rank);
    std::vector<int> peers;  // local index li on every host
    for (const auto& m : hosts.members) peers.push_back(m[static_cast<size_t>(li)]);
    const Range mine = blocks[static_cast<size_t>(li)];
    std::vector<Range> sub = evenBlocks(mine.bytes / elementSize, H, elementSize);
    for (Range& r : sub) r.offset += mine.offset;
    Schedule across =
        H > 1 ? onRanks(ringAllreduce(hosts.host(rank), H, sub, finalize), peers) : Schedule{};
    if (H == 1 && finalize) across.push_back(Step{.finalize = {mine}});
    // Every rank is in one such ring: all have the same length.
    for (Step& s : across) out.push_back(std::move(s));
    intraHost(out, rank, hosts, [&](int i, int n) { return ringAllgather(i, n, blocks); });
    return out;
  }
  // One leader per host: reduce to it, allreduce among the leaders, spread.
  intraHost(out, rank, hosts, [&](int i, int n) { return treeReduce(i, n, 0, bytes); });
  const Builder amongLeaders = [&](int i, int n) {
    Schedule s = n == 1  ? Schedule{}
                 : split ? ringAllreduce(i, n, evenBlocks(count, n, elementSize), finalize)
                 : isPowerOfTwo(n) ? recursiveDoublingAllreduce(i, n, bytes, finalize)
                                   : treeAllreduce(i, n, bytes, finalize);
    if (n == 1 && finalize) s.push_back(Step{.finalize = {Range{0, bytes}}});
    return s;
  };
  interHost(out, rank, leaders(hosts, -1), amongLeaders);
  intraHost(out, rank, hosts, [&](int i, int n) { return treeBroadcast(i, n, 0, bytes); });
  return out;
}

Schedule hierarchicalBroadcast(int rank, const Hosts& hosts, int root, size_t bytes, bool chain) {
  if (hosts.size() == 1) return {};
  const TreeLinks t = hostTree(rank, hosts, root, Shape{chain});
  Step step;
  std::vector<int> gates;
  if (t.parent >= 0) {
    step.recvs.push_back(RecvSpec{t.parent, Range{0, bytes}, Combine::Copy});
    gates.push_back(0);
  }
  for (int c : t.children) step.sends.push_back(SendSpec{c, Range{0, bytes}, gates});
  return Schedule{std::move(step)};
}

Schedule hierarchicalReduce(int rank, const Hosts& hosts, int root, size_t bytes, bool chain) {
  if (hosts.size() == 1) return {};
  const TreeLinks t = hostTree(rank, hosts, root, Shape{chain});
  Step step;
  std::vector<int> gates;
  for (int c : t.children) {
    gates.push_back(static_cast<int>(step.recvs.size()));
    step.recvs.push_back(RecvSpec{c, Range{0, bytes}, Combine::Reduce});
  }
  if (t.parent >= 0) step.sends.push_back(SendSpec{t.parent, Range{0, bytes}, gates});
  return Schedule{std::move(step)};
}

Schedule hierarchicalBarrier(int rank, const Hosts& hosts) {
  Schedule out;
  // Arrive at the leader, a dissemination barrier among leaders, release.
  intraHost(out, rank, hosts, [](int i, int n) {
    return linearGather(i, n, 0, Range{}, std::vector<Range>(static_cast<size_t>(n)));
  });
  interHost(out, rank, leaders(hosts, -1), [](int i, int n) { return disseminationBarrier(i, n); });
  intraHost(out, rank, hosts, [](int i, int n) {
    return linearScatter(i, n, 0, std::vector<Range>(static_cast<size_t>(n)), Range{});
  });
  return out;
}

}  // namespace rdmacc::algorithms
