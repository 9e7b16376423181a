// The shared-memory transport without a second process: what is left behind
// when a local peer never arrives, single-copy writes to an address that is
// not there, and a peer that corrupts the ring or the one-shot board it
// writes (two ranks as two threads of this process).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "rdmacc/backend.hpp"
#include "rdmacc/error.hpp"
#include "rdmacc/log.hpp"
#include "rdmacc/store.hpp"
#include "rdmacc/version.hpp"
#include "src/store/store_util.hpp"
#include "src/transport/options.hpp"
#include "src/transport/rdma/handshake.hpp"
#include "src/transport/shm/cma.hpp"
#include "src/transport/shm/transport.hpp"
#include "src/transport/shm/transport_impl.hpp"

namespace rdmacc {
namespace {

using namespace std::chrono_literals;

// Segment files this process holds open (memfds named "rdmacc-<pid>-...").
size_t ourSegments() {
  size_t n = 0;
  const std::string prefix = "/memfd:rdmacc-" + std::to_string(::getpid()) + "-";
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd")) {
    std::error_code error;
    if (std::filesystem::read_symlink(entry.path(), error).string().starts_with(prefix)) ++n;
  }
  return n;
}

// The error for rank 1, whose segment never appeared: with its process
// `pid` alive, the segment is named; gone, its exit.
void expectNamesRankOne(const Error& e, int pid) {
  const std::string what = e.what();
  EXPECT_NE(what.find(pid == ::getpid() ? "rank 1's shared-memory segment /rdmacc-"
                                        : "rank 1 (pid 1073741823) exited before its "
                                          "shared-memory segment"),
            std::string::npos)
      << what;
  EXPECT_EQ(e.info().peerRank, 1) << what;
}

// Rank 1 announced itself on this host, and the segment its record names
// never appears: rank 0's setup fails naming rank 1 (within the connect
// timeout while rank 1's process lives, at once when it has exited), and
// its own segment's file is closed (a constructor that throws runs no
// destructor).
TEST(ShmTransport, APeerThatNeverArrivesLeavesNoSegmentBehind) {
  for (const int pid : {::getpid(), 0x3fffffff}) {  // alive; no such process
    auto store = std::make_shared<HashStore>(500ms);
    const std::string group = fmt::format("lonely{}", pid);
    store->set(
        fmt::format("rdmacc/host/{}/1", group),
        toBytes(fmt::format("rdmacc {} protocol {}\nRDMACC_TRANSPORT=shm "
                            "RDMACC_IB_RAILS=1 RDMACC_CONNECT=eager RDMACC_SHARE_CONNECTIONS=1\n"
                            "/rdmacc-{}-00000000deadbeef:{}:999\n-\n-\n"
                            "same-host",
                            version(), handshake::kVersion, ::getpid(), pid)));
    const size_t before = ourSegments();
    try {
      VerbsBackend backend(store, 0, 2,
                           VerbsBackend::Options{.groupName = group,
                                                 .config = {{"RDMACC_TRANSPORT", "shm"},
                                                            {"RDMACC_HOST_ID", "same-host"},
                                                            {"RDMACC_CONNECT_TIMEOUT", "500ms"},
                                                            {"RDMACC_STORE_TIMEOUT", "500ms"}}});
      FAIL() << "a group formed without rank 1";
    } catch (const Error& e) {
      expectNamesRankOne(e, pid);
    }
    EXPECT_EQ(ourSegments(), before);
  }
}

// The segment a peer's record names (its /proc/PID/fd/FD) belongs to
// another user, others may open it, or it is not sealed against shrinking:
// rank 0 refuses it, naming rank 1, the path and what is wrong, and never
// maps it (the unsealed one only until the connect timeout: its owner may
// be about to seal it). Handing a file to another user needs root.
TEST(ShmTransport, ASegmentOfAnotherUserOrUnsealedIsRefused) {
  enum class Plant { OpenToOthers, ForeignOwner, Unsealed };
  for (const Plant plant : {Plant::OpenToOthers, Plant::ForeignOwner, Plant::Unsealed}) {
    if (plant == Plant::ForeignOwner && ::geteuid() != 0) continue;
    const auto kind = static_cast<int>(plant);
    const std::string name = fmt::format("/rdmacc-{}-00000000c0ffee0{}", ::getpid(), kind);
    net::Fd file = createSegmentFile(name);
    ASSERT_EQ(::ftruncate(file.get(), 1 << 20), 0);
    if (plant == Plant::ForeignOwner) {
      ASSERT_EQ(::fchown(file.get(), 65534, 65534), 0) << std::strerror(errno);
    } else if (plant == Plant::OpenToOthers) {
      ASSERT_EQ(::fchmod(file.get(), 0666), 0) << std::strerror(errno);
    }
    auto store = std::make_shared<HashStore>(2s);
    const std::string group = fmt::format("foreign{}", kind);
    store->set(
        fmt::format("rdmacc/host/{}/1", group),
        toBytes(fmt::format("rdmacc {} protocol {}\nRDMACC_TRANSPORT=shm "
                            "RDMACC_IB_RAILS=1 RDMACC_CONNECT=eager "
                            "RDMACC_SHARE_CONNECTIONS=1\n{}\n-\n-\nsame-host",
                            version(), handshake::kVersion, segmentRecord(name, file.get()))));
    const std::string path = fmt::format("/proc/{}/fd/{}", ::getpid(), file.get());
    const std::string expected =
        plant == Plant::Unsealed
            ? fmt::format(
                  "rank 1's shared-memory segment {} ({}) was not ready within 1000 ms: "
                  "it was not sealed against shrinking",
                  name, path)
            : fmt::format(
                  "rank 1's segment {} belongs to uid {} with mode {}, not to this "
                  "rank's uid {} with mode 600",
                  path, plant == Plant::ForeignOwner ? 65534u : ::geteuid(),
                  plant == Plant::ForeignOwner ? "600" : "666", ::geteuid());
    try {
      VerbsBackend backend(store, 0, 2,
                           VerbsBackend::Options{.groupName = group,
                                                 .config = {{"RDMACC_TRANSPORT", "shm"},
                                                            {"RDMACC_HOST_ID", "same-host"},
                                                            {"RDMACC_CONNECT_TIMEOUT", "1s"}}});
      ADD_FAILURE() << "a group formed on a segment that is not the peer's";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(expected), std::string::npos) << e.what();
      EXPECT_EQ(e.info().peerRank, 1) << e.what();
    }
  }
}

// A peer that shrinks its segment under this rank's mapping would make this
// rank's next access to it fault (SIGBUS). Segments are sealed once built:
// the kernel refuses to shrink or grow them to any process holding one, its
// owner included (before, a POSIX shared-memory object could be truncated
// by any process of the user).
TEST(ShmTransport, ASegmentCannotBeShrunkUnderItsPeersMappings) {
  HashStore store(10s);
  auto file = std::make_shared<net::Fd>(createSegmentFile(newSegmentName()));
  std::vector<std::unique_ptr<Transport>> ranks(2);
  {
    std::vector<std::jthread> forming;
    for (int r = 0; r < 2; ++r) {
      forming.emplace_back([&, r] {
        TransportOptions o;
        o.group = "sealed";
        o.rank = r;
        o.size = 2;
        o.connectTimeout = 10'000ms;
        o.slotBytes = 64 * 1024;
        if (r == 0) o.shmSegmentFile = file;  // rank 0's, kept open by this test
        ranks[static_cast<size_t>(r)] = makeShmTransport(store, o, {true, true});
      });
    }
  }
  ASSERT_TRUE(ranks[0] && ranks[1]);
  struct stat st {};
  ASSERT_EQ(::fstat(file->get(), &st), 0);
  EXPECT_EQ(::ftruncate(file->get(), 0), -1);
  EXPECT_EQ(errno, EPERM);
  EXPECT_EQ(::ftruncate(file->get(), st.st_size / 2), -1);
  EXPECT_EQ(::ftruncate(file->get(), st.st_size * 2), -1);
  const int seals = ::fcntl(file->get(), F_GET_SEALS);
  EXPECT_EQ(seals & (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL),
            F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL);
  EXPECT_NE(::fcntl(file->get(), F_ADD_SEALS, F_SEAL_WRITE), 0) << "the seals can be changed";
}

// Bytes of memory behind a segment's file (what the host gives it).
size_t allocatedBytes(const net::Fd& file) {
  struct stat st {};
  EXPECT_EQ(::fstat(file.get(), &st), 0);
  return static_cast<size_t>(st.st_blocks) * 512;
}

// Three ranks of one group as threads of this process; rank 0's segment
// file is `file`. Without a one-shot board unless `board` (as in a group
// that also has RDMA peers): a lazy group's peers then map each other's
// segments at first contact.
std::vector<std::unique_ptr<Transport>> formThree(Store& store, const std::string& group, bool lazy,
                                                  std::shared_ptr<net::Fd> file,
                                                  bool board = false) {
  std::vector<std::unique_ptr<Transport>> ranks(3);
  std::vector<std::jthread> forming;
  for (int r = 0; r < 3; ++r) {
    forming.emplace_back([&, r] {
      TransportOptions o;
      o.group = group;
      o.rank = r;
      o.size = 3;
      o.lazy = lazy;
      o.connectTimeout = 10'000ms;
      o.slotBytes = 64 * 1024;
      if (!board) o.shmOneShotBytes = 0;
      if (r == 0) o.shmSegmentFile = file;
      ranks[static_cast<size_t>(r)] = makeShmTransport(store, o, {true, true, true});
    });
  }
  forming.clear();
  return ranks;
}

bool sendOne(Transport& from, int to) {
  wire::Header h;
  h.kind = wire::MessageKind::PointToPoint;
  const uint64_t payload = 42;
  h.payload = sizeof payload;
  h.check = sizeof payload;
  return from.trySend(to, h, reinterpret_cast<const uint8_t*>(&payload), nullptr, std::nullopt);
}

// Three ranks of a lazy group (as threads). Rank 0's segment holds a lane of
// slots for each of its two peers: at formation none has memory behind it
// (only the head, the rings and the board do); rank 1's first message gives
// rank 1's lane its memory, and rank 2's lane stays without. An eager group
// reserves the whole segment at formation, as before.
TEST(ShmTransport, ASendersSlotsGetTheirMemoryAtItsFirstSend) {
  for (const bool lazy : {true, false}) {
    SCOPED_TRACE(lazy ? "lazy" : "eager");
    HashStore store(10s);
    auto file = std::make_shared<net::Fd>(createSegmentFile(newSegmentName()));
    auto ranks = formThree(store, lazy ? "slots-lazy" : "slots-eager", lazy, file);
    ASSERT_TRUE(ranks[0] && ranks[1] && ranks[2]);
    struct stat st {};
    ASSERT_EQ(::fstat(file->get(), &st), 0);
    const auto segment = static_cast<size_t>(st.st_size);
    const size_t laneSlots = 16 * 64 * 1024;  // slots per peer x slot bytes
    const size_t formed = allocatedBytes(*file);
    if (!lazy) {
      EXPECT_GE(formed, segment);
      continue;
    }
    EXPECT_LT(formed, laneSlots) << "of a segment of " << segment << " bytes";
    ASSERT_TRUE(sendOne(*ranks[1], 0));
    const size_t sent = allocatedBytes(*file);
    EXPECT_GE(sent, formed + laneSlots);  // rank 1's lane, whole
    EXPECT_LT(sent, formed + 2 * laneSlots) << "rank 2's lane has memory too";
  }
}

// A lazy group without a board maps a local peer's segment at first
// contact: rank 0's segment counts the peers that mapped it
// (SegmentHead::mappedBy), none at formation, rank 1 after its first
// message, never rank 2, which sent nothing. An eager group's peers, and a
// lazy group's with a one-shot board (whose first collective reads every
// peer), all map it while forming.
TEST(ShmTransport, ALazyGroupMapsAPeersSegmentAtFirstContact) {
  struct Case {
    const char* name;
    bool lazy;
    bool board;
  };
  for (const Case& c :
       {Case{"lazy", true, false}, Case{"eager", false, false}, Case{"lazy-board", true, true}}) {
    SCOPED_TRACE(c.name);
    HashStore store(10s);
    auto file = std::make_shared<net::Fd>(createSegmentFile(newSegmentName()));
    auto ranks = formThree(store, fmt::format("map-{}", c.name), c.lazy, file, c.board);
    ASSERT_TRUE(ranks[0] && ranks[1] && ranks[2]);
    void* at = ::mmap(nullptr, sizeof(shm::SegmentHead), PROT_READ, MAP_SHARED, file->get(), 0);
    ASSERT_NE(at, MAP_FAILED);
    const auto* head = static_cast<const shm::SegmentHead*>(at);
    if (!c.lazy || c.board) {
      EXPECT_EQ(head->mappedBy.load(), 2u);
    } else {
      EXPECT_EQ(head->mappedBy.load(), 0u) << "formation mapped rank 0's segment";
      ASSERT_TRUE(sendOne(*ranks[1], 0));
      EXPECT_EQ(head->mappedBy.load(), 1u);
      // Rank 0 answers rank 1 and reads what it sent: rank 2 still never mapped it.
      ASSERT_TRUE(sendOne(*ranks[0], 1));
      EXPECT_EQ(head->mappedBy.load(), 1u);
    }
    ::munmap(at, sizeof(shm::SegmentHead));
  }
}

// A lazy group forms without its local peers' segments; the first message to
// a peer whose process is gone fails naming it, and to one whose segment
// never appears, within the connect timeout.
TEST(ShmTransport, ALazyFirstContactWithAPeerGoneOrNeverReadyIsNamed) {
  for (const int pid : {::getpid(), 0x3fffffff}) {  // alive; no such process
    SCOPED_TRACE(pid);
    HashStore store(2s);
    TransportOptions o;
    o.group = fmt::format("lazy-gone{}", pid);
    o.rank = 0;
    o.size = 2;
    o.lazy = true;
    o.shmOneShotBytes = 0;  // no board: mapped at first contact
    o.connectTimeout = 300ms;
    o.shmRecords = {"", fmt::format("/rdmacc-{}-00000000deadbeef:{}:999", ::getpid(), pid)};
    auto t = makeShmTransport(store, o, {true, true});
    const auto start = std::chrono::steady_clock::now();
    try {
      while (!sendOne(*t, 1)) {
        ASSERT_LT(std::chrono::steady_clock::now() - start, 5s) << "no error";
        std::this_thread::sleep_for(10ms);
      }
      FAIL() << "a message went to a peer that is not there";
    } catch (const Error& e) {
      expectNamesRankOne(e, pid);
    }
  }
}

// Single-copy writes go where a peer's advert says; an address the peer does
// not have (a hostile or stale advert) is refused by the kernel, reported,
// and nothing is written: the transport then sends through the slot.
TEST(SingleCopy, WritesWhereAskedAndRefusesAnAddressThatIsNotMapped) {
  std::string why;
  uint64_t target = 0;
  const uint64_t value = 0x1122334455667788;
  ASSERT_TRUE(
      cma::write(::getpid(), &value, reinterpret_cast<uintptr_t>(&target), sizeof value, why))
      << why;
  EXPECT_EQ(target, value);
  uint64_t back = 0;
  ASSERT_TRUE(cma::read(::getpid(), reinterpret_cast<uintptr_t>(&target), &back, sizeof back, why))
      << why;
  EXPECT_EQ(back, value);
  EXPECT_FALSE(cma::write(::getpid(), &value, 16, sizeof value, why));
  EXPECT_NE(why.find("process_vm_writev"), std::string::npos) << why;
  EXPECT_FALSE(cma::read(::getpid(), 16, &back, sizeof back, why));
  EXPECT_NE(why.find("process_vm_readv"), std::string::npos) << why;
}

// Where this process mapped the shared-memory segment `name` ("/rdmacc-..."),
// from /proc/self/maps (a memfd: "/memfd:rdmacc-... (deleted)").
uint8_t* mappedSegment(const std::string& name) {
  std::ifstream maps("/proc/self/maps");
  for (std::string line; std::getline(maps, line);) {
    if (line.find("/memfd:" + name.substr(1) + " ") == std::string::npos) continue;
    return reinterpret_cast<uint8_t*>(std::stoull(line.substr(0, line.find('-')), nullptr, 16));
  }
  return nullptr;
}

// Rank r of a group of two named `name`, on shm only.
std::unique_ptr<VerbsBackend> formRank(const std::shared_ptr<Store>& store, const std::string& name,
                                       int r) {
  return std::make_unique<VerbsBackend>(
      store, r, 2,
      VerbsBackend::Options{.groupName = name,
                            .config = {{"RDMACC_TRANSPORT", "shm"},
                                       {"RDMACC_HOST_ID", "same-host"},
                                       {"RDMACC_TIMEOUT", "20s"}}});
}

// Both ranks of group `name` as two backends of this process.
std::vector<std::unique_ptr<VerbsBackend>> formPair(const std::shared_ptr<Store>& store,
                                                    const std::string& name) {
  std::vector<std::unique_ptr<VerbsBackend>> ranks(2);
  std::vector<std::jthread> forming;
  for (int r = 0; r < 2; ++r) {
    forming.emplace_back([&, r] { ranks[static_cast<size_t>(r)] = formRank(store, name, r); });
  }
  return ranks;
}

// A one-float sum on both ranks; errors by rank (empty: it worked and summed
// to 2). rank0First: rank 0's allreduce runs (and ends) before rank 1's
// starts.
std::vector<std::string> allreduceOnBoth(std::vector<std::unique_ptr<VerbsBackend>>& ranks,
                                         bool rank0First = false) {
  std::vector<std::string> errors(2);
  std::vector<std::jthread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      float value = 1;
      std::vector<Tensor> t{Tensor{&value, 1, DataType::Float32}};
      try {
        ranks[static_cast<size_t>(r)]->allreduce(t)->wait();
        EXPECT_EQ(value, 2.0f);
      } catch (const Error& e) {
        errors[static_cast<size_t>(r)] = e.what();
      }
    });
    if (rank0First) threads.back().join();
  }
  threads.clear();
  return errors;
}

// Rank `rank`'s segment of group `name` as this process mapped it, and its
// geometry from its head.
std::pair<uint8_t*, shm::Geometry> segmentOf(Store& store, const std::string& name, int rank) {
  // Line 3 of the rank's host record: "name:pid:fd".
  const std::string text = toString(store.get(fmt::format("rdmacc/host/{}/{}", name, rank)));
  const size_t line3 = text.find('\n', text.find('\n') + 1) + 1;
  uint8_t* segment = mappedSegment(text.substr(line3, text.find(':', line3) - line3));
  if (segment == nullptr) return {nullptr, {}};
  const auto* head = reinterpret_cast<const shm::SegmentHead*>(segment);
  EXPECT_EQ(head->magic, shm::kMagic);
  return {segment, shm::Geometry{.lanes = head->lanes,
                                 .slots = head->slots,
                                 .ringEntries = head->ringEntries,
                                 .slotBytes = head->slotBytes,
                                 .boardEntries = head->boardEntries,
                                 .boardEntryBytes = head->boardEntryBytes}};
}

// A peer whose record gives this process's own pid gets no single-copy
// writes: a rogue peer that copied this rank's pid, base and nonce would
// otherwise pass the probe and steer this rank's writes into its own memory.
// Two ranks in one process are such a pair; the group still works.
TEST(ShmTransport, NoSingleCopyToAPeerThatGivesOurOwnPid) {
  std::mutex mutex;
  std::vector<std::string> lines;
  const LogLevel level = logLevel();
  setLogLevel(LogLevel::Info);
  setLogSink([&](LogLevel, std::string_view line) {
    std::lock_guard lock(mutex);
    lines.emplace_back(line);
  });
  auto store = std::make_shared<HashStore>(20s);
  {
    auto ranks = formPair(store, "own-pid");
    EXPECT_EQ(allreduceOnBoth(ranks), (std::vector<std::string>{"", ""}));
  }
  setLogSink(nullptr);
  setLogLevel(level);
  size_t refused = 0;
  for (const auto& line : lines)
    refused += line.find("it gave this process's own pid") != std::string::npos;
  EXPECT_EQ(refused, 2u) << "each rank should refuse single-copy writes to the other";
}

// Rank 1 "writes" a tail into its lane of rank 0's segment that runs further
// ahead than the ring has entries (a corrupt or hostile peer): rank 0 refuses
// it before reading a record, fails its operation with an error that names
// rank 1 and the tail it published, and rank 1 learns of the failure too;
// nothing hangs.
TEST(ShmTransport, ACorruptRingTailFailsTheGroupNamingThePeer) {
  auto store = std::make_shared<HashStore>(10s);
  auto ranks = formPair(store, "corrupt");
  ASSERT_TRUE(ranks[0] && ranks[1]);
  std::vector<std::string> errors = allreduceOnBoth(ranks);  // the group works
  ASSERT_EQ(errors, std::vector<std::string>(2)) << errors[0] << " / " << errors[1];

  const auto [segment, geometry] = segmentOf(*store, "corrupt", 0);
  ASSERT_NE(segment, nullptr) << "rank 0's segment is not in /proc/self/maps";
  // Rank 0's only local peer is rank 1: lane 0 of its segment is rank 1's.
  auto* ring = reinterpret_cast<shm::RingHead*>(segment + geometry.ringOffset(0));
  // Rank 1 publishes its own count (tail = ++its count): any message of its
  // would overwrite a corrupt tail before rank 0 looked, and the corruption
  // would never be seen. So the tail is corrupted only once it has stood
  // still for 100 ms (the group is idle: rank 1 sends nothing until the
  // next operation), and rank 0's allreduce runs, and fails, before rank 1's
  // starts.
  uint64_t tail = ring->tail.load();
  for (;;) {
    std::this_thread::sleep_for(100ms);
    const uint64_t now = ring->tail.load();
    if (now == tail) break;
    tail = now;
  }
  const uint64_t bogus = tail + geometry.ringEntries + 7;
  ring->tail.store(bogus);

  const auto start = std::chrono::steady_clock::now();
  errors = allreduceOnBoth(ranks, /*rank0First=*/true);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 15s);
  EXPECT_NE(errors[0].find(fmt::format("rank 1 sent a ring tail of {}", bogus)), std::string::npos)
      << errors[0];
  EXPECT_FALSE(errors[1].empty()) << "rank 1 did not learn of the failure";
}

// Rank 1 forges the board entry rank 0 reads next for a one-shot allreduce
// (a corrupt or hostile peer): `forge` gets the entry and the sequence rank 0
// will look for. Rank 0 fails naming rank 1 and what it posted, reads no
// payload of the forged size, and rank 1 learns of the failure; nothing
// hangs.
void forgedBoardEntryFails(const std::string& name,
                           const std::function<void(shm::BoardEntry&, uint64_t)>& forge,
                           const std::string& expected) {
  auto store = std::make_shared<HashStore>(10s);
  auto ranks = formPair(store, name);
  ASSERT_TRUE(ranks[0] && ranks[1]);
  std::vector<std::string> errors = allreduceOnBoth(ranks);  // the group works
  ASSERT_EQ(errors, std::vector<std::string>(2)) << errors[0] << " / " << errors[1];

  const auto [segment, geometry] = segmentOf(*store, name, 1);
  ASSERT_NE(segment, nullptr) << "rank 1's segment is not in /proc/self/maps";
  ASSERT_GT(geometry.boardEntries, 0U) << "no one-shot board";
  auto entry = [&](uint64_t i) {
    return reinterpret_cast<shm::BoardEntry*>(segment + geometry.boardOffset() +
                                              i * geometry.boardEntryBytes);
  };
  uint64_t last = 0;  // the last collective rank 1 posted
  for (uint64_t i = 0; i < geometry.boardEntries; ++i)
    last = std::max(last, entry(i)->sequence.load());
  ASSERT_GT(last, 0U) << "the working allreduce did not go through the board";
  const uint64_t next = last + 1;
  forge(*entry(next % geometry.boardEntries), next);

  const auto start = std::chrono::steady_clock::now();
  errors = allreduceOnBoth(ranks, /*rank0First=*/true);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 15s);
  EXPECT_NE(errors[0].find("rank 1"), std::string::npos) << errors[0];
  EXPECT_NE(errors[0].find(fmt::format(fmt::runtime(expected), next)), std::string::npos)
      << errors[0];
  EXPECT_FALSE(errors[1].empty()) << "rank 1 did not learn of the failure";
}

// An entry that claims a later collective than the one rank 0 reads (as if
// rank 1 had run ahead over an entry rank 0 had not read).
TEST(ShmBoard, AnEntryPostedAheadFailsTheGroupNamingThePeer) {
  forgedBoardEntryFails(
      "board-ahead",
      [](shm::BoardEntry& e, uint64_t next) {
        e.check = 0;
        e.bytes = 4;
        e.sequence.store(next + 8);
      },
      "over collective #{},");
}

// An entry for the right collective whose size field is far beyond the
// entry (1 TiB): refused by comparison with rank 0's own size, never read.
TEST(ShmBoard, AnEntryOfAnotherSizeFailsTheGroupNamingThePeer) {
  forgedBoardEntryFails(
      "board-size",
      [](shm::BoardEntry& e, uint64_t next) {
        e.bytes = uint64_t{1} << 40;
        e.sequence.store(next);
      },
      "collective #{} does not match on rank 1: it posted 1099511627776 bytes");
}

// The doorbells (wake-up sockets) live in /tmp/rdmacc-<uid>, a directory
// only this user can enter, not in the abstract namespace, where any local
// user could bind a rank's name first (it is in the store and /dev/shm) and
// fail the rank, or flood it. Here a stranger binds rank 0's old abstract
// name as soon as rank 0 published it: the pair still forms and works; the
// directory is private, a socket left by a crashed process is removed, and
// the ranks' own are gone with them.
TEST(ShmTransport, DoorbellsLiveInAPrivateDirectory) {
  const std::string dir = fmt::format("/tmp/rdmacc-{}", ::geteuid());
  auto bindTo = [](const std::string& path, bool abstract) {
    int fd = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::memcpy(addr.sun_path + (abstract ? 1 : 0), path.data(), path.size());
    const auto length =
        static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + (abstract ? 1 : 0) + path.size());
    EXPECT_EQ(::bind(fd, reinterpret_cast<const sockaddr*>(&addr), length), 0)
        << path << ": " << std::strerror(errno);
    return fd;
  };
  // A socket file left by a process that crashed (nobody holds it).
  ::mkdir(dir.c_str(), 0700);
  const std::string stale = dir + "/rdmacc-1-00000000000dead1.bell";
  ::unlink(stale.c_str());
  ::close(bindTo(stale, false));
  ASSERT_TRUE(std::filesystem::exists(stale));

  auto store = std::make_shared<HashStore>(20s);
  const std::string group = "doorbell";
  std::vector<std::unique_ptr<VerbsBackend>> ranks(2);
  auto form = [&](int r) { ranks[static_cast<size_t>(r)] = formRank(store, group, r); };
  int squatter = -1;
  std::string bell;
  {
    std::jthread first([&] { form(0); });
    // Rank 0's record names its segment; the stranger binds the abstract
    // name rdmacc used to bind for it before rank 1 arrives.
    const std::string text = toString(store->get(fmt::format("rdmacc/host/{}/0", group)));
    const size_t line3 = text.find('\n', text.find('\n') + 1) + 1;
    const std::string name = text.substr(line3, text.find(':', line3) - line3);
    squatter = bindTo("rdmacc" + name, true);
    bell = dir + name + ".bell";
    std::jthread second([&] { form(1); });
  }
  ASSERT_TRUE(ranks[0] && ranks[1]);
  EXPECT_EQ(allreduceOnBoth(ranks), (std::vector<std::string>{"", ""}));
  struct stat st {};
  ASSERT_EQ(::lstat(dir.c_str(), &st), 0);
  EXPECT_TRUE(S_ISDIR(st.st_mode));
  EXPECT_EQ(st.st_uid, ::geteuid());
  EXPECT_EQ(st.st_mode & 0777, 0700u);
  EXPECT_TRUE(std::filesystem::exists(bell)) << bell;
  EXPECT_FALSE(std::filesystem::exists(stale)) << "the crashed process's socket is still there";
  ranks.clear();
  EXPECT_FALSE(std::filesystem::exists(bell)) << bell << " outlived its transport";
  ::close(squatter);
}

}  // namespace
}  // namespace rdmacc
