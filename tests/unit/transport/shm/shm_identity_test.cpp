// Whose process a single-copy write lands in. A local peer's record gives
// its pid; a hostile peer could give a third local process's pid (one that
// maps the peer's segment at the same address, so the nonce check passes)
// and steer this rank's writes into that process. The hello each peer sends
// through the doorbell carries its pid in the kernel's words; writes wait
// for it (src/transport/shm/hello.cpp, docs/security.md).
//
// Three processes: rank 0 (this one), rank 1 (a child) and, in the hostile
// case, a child of rank 1 forked after its segment was mapped, whose pid
// rank 1 publishes as its own.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "rdmacc/log.hpp"
#include "rdmacc/store.hpp"
#include "src/store/store_util.hpp"
#include "src/transport/options.hpp"
#include "src/transport/shm/doorbell.hpp"
#include "src/transport/shm/transport.hpp"
#include "src/transport/transport.hpp"

namespace rdmacc {
namespace {

using namespace std::chrono_literals;

// At the same address in every process forked from this one: the target of
// rank 0's single-copy write.
volatile uint64_t gCanary = 0;
constexpr uint64_t kWritten = 0x5752495454454e21;  // "WRITTEN!"

// Shared by the three processes (mapped before the forks).
struct Report {
  std::atomic<uint64_t> rank1Saw{0};  // gCanary as rank 1's process sees it
  std::atomic<uint64_t> thirdSaw{0};  // and as the third process sees it
  std::atomic<int> thirdPid{0};
  std::atomic<int> crafted{0};  // datagrams the third process got into rank 0's doorbell
  std::atomic<int> stop{0};
};

// How rank 1 behaves: as it should; publishing a third process's pid as its
// own; or honest, while a third process sends rank 0's doorbell crafted
// hellos (any local process of the user can).
enum class Mode { Honest, ForgedPid, CraftedHellos };

// The third process of Mode::CraftedHellos: every datagram a local process
// could send rank 0's doorbell instead of a hello, then one claiming rank 1
// from the wrong pid. `record`: rank 0's ("segment name:pid").
[[noreturn]] void sendCraftedHellos(const std::string& record, Report& report) {
  socklen_t length = 0;
  const sockaddr_un bell = shm::doorbellAddress(record.substr(0, record.find(':')), length);
  const int s = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  auto send = [&](const void* data, size_t bytes) {
    for (int tries = 0; tries < 5000; ++tries) {  // the doorbell may not be bound yet
      if (::sendto(s, data, bytes, 0, reinterpret_cast<const sockaddr*>(&bell), length) >= 0) {
        report.crafted.fetch_add(1);
        return;
      }
      ::usleep(1000);
    }
  };
  constexpr uint32_t kMagic = 0x6c6c6568;
  const uint32_t badMagic[2] = {0xdeadbeef, 1};
  const uint32_t outOfRange[2] = {kMagic, 7};
  const uint32_t negative[2] = {kMagic, 0xffffffff};
  const uint32_t itself[2] = {kMagic, 0};  // rank 0's own rank: no local peer of its
  const uint32_t asRank1[2] = {kMagic, 1};
  const char shortOne[3] = {'h', 'e', 'l'};
  char longOne[100] = {};
  std::memcpy(longOne, asRank1, sizeof asRank1);
  send(badMagic, sizeof badMagic);
  send(outOfRange, sizeof outOfRange);
  send(negative, sizeof negative);
  send(itself, sizeof itself);
  send(shortOne, sizeof shortOne);
  send(longOne, sizeof longOne);
  send(asRank1, sizeof asRank1);
  ::close(s);
  ::_exit(0);
}

TransportOptions optionsFor(const std::string& group, int rank) {
  TransportOptions o;
  o.group = group;
  o.rank = rank;
  o.size = 2;
  o.connectTimeout = 20'000ms;
  o.slotBytes = 64 * 1024;
  o.shmOneShotBytes = 0;
  return o;
}

// Publishes what this process sees at gCanary until told to stop.
void watch(std::atomic<uint64_t>& into, const Report& report) {
  while (report.stop.load() == 0) {
    into.store(gCanary);
    ::usleep(1000);
  }
}

// Rank 1: forms, then keeps its doorbell read (its hello may have been
// refused by a full queue) and watches. Mode::ForgedPid: publishes the pid
// of a child forked after its segment was mapped.
[[noreturn]] void rank1(const std::string& path, const std::string& group, Mode mode,
                        Report& report) {
  try {
    FileStore store(path, 20s);
    TransportOptions o = optionsFor(group, 1);
    if (mode == Mode::CraftedHellos) {
      o.allGather = [&](const std::string& prefix, const Bytes& mine,
                        const std::vector<int>& participants, const std::vector<int>& wanted) {
        auto records = exchangeRecords(store, {}, prefix, 1, mine, participants, wanted);
        const std::string rank0 = toString(records.at(0));
        const pid_t third = ::fork();
        if (third == 0) sendCraftedHellos(rank0, report);
        report.thirdPid.store(third);
        return records;
      };
    }
    if (mode == Mode::ForgedPid) {
      o.allGather = [&](const std::string& prefix, const Bytes& mine,
                        const std::vector<int>& participants, const std::vector<int>& wanted) {
        const pid_t third = ::fork();
        if (third == 0) {
          watch(report.thirdSaw, report);
          ::_exit(0);
        }
        report.thirdPid.store(third);
        // "name:pid:fd": the third process inherited the descriptor.
        const std::string record = toString(mine);
        const std::string forged = fmt::format("{}:{}:{}", record.substr(0, record.find(':')),
                                               third, record.substr(record.rfind(':') + 1));
        return exchangeRecords(store, {}, prefix, 1, toBytes(forged), participants, wanted);
      };
    }
    auto transport = makeShmTransport(store, o, {true, true});
    while (report.stop.load() == 0) {
      transport->consumeEvents();
      report.rank1Saw.store(gCanary);
      ::usleep(1000);
    }
    if (const int third = report.thirdPid.load(); third > 0) ::waitpid(third, nullptr, 0);
    ::_exit(0);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rank 1: %s\n", e.what());
    ::_exit(2);
  }
}

struct Outcome {
  uint64_t rank1Saw = 0;
  uint64_t thirdSaw = 0;
  int rank1Pid = 0;
  std::string described;  // rank 0's describePeer(1) before the write
  std::vector<std::string> warnings;
};

// Rank 0 forms with rank 1, waits up to 3 s for single-copy writes to it to
// be on (and for the crafted hellos to be in), then writes kWritten
// single-copy to gCanary in "rank 1's" process.
Outcome run(Mode mode) {
  const std::string group = fmt::format("identity-{}-{}", ::getpid(), static_cast<int>(mode));
  const std::string path = fmt::format("/tmp/rdmacc-test-{}.store", group);
  std::remove(path.c_str());
  auto* report = static_cast<Report*>(
      ::mmap(nullptr, sizeof(Report), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  EXPECT_NE(report, MAP_FAILED);
  new (report) Report{};
  Outcome out;
  std::mutex mutex;
  setLogSink([&](LogLevel level, std::string_view line) {
    std::lock_guard lock(mutex);
    if (level == LogLevel::Warn) out.warnings.emplace_back(line);
  });
  out.rank1Pid = ::fork();
  if (out.rank1Pid == 0) rank1(path, group, mode, *report);
  {
    FileStore store(path, 20s);
    auto transport = makeShmTransport(store, optionsFor(group, 0), {true, true});
    const auto deadline = std::chrono::steady_clock::now() + 3s;
    do {
      transport->consumeEvents();
      out.described = transport->describePeer(1);
      std::this_thread::sleep_for(1ms);
    } while ((!out.described.ends_with("writes on") ||
              (mode == Mode::CraftedHellos && report->crafted.load() < 7)) &&
             std::chrono::steady_clock::now() < deadline);
    for (int i = 0; i < 10; ++i) transport->consumeEvents();  // what the doorbell still holds
    const uint64_t payload = kWritten;
    wire::Header h;
    h.kind = wire::MessageKind::PointToPoint;
    h.payload = sizeof payload;
    h.check = sizeof payload;
    EXPECT_TRUE(transport->trySend(1, h, reinterpret_cast<const uint8_t*>(&payload), nullptr,
                                   DirectTarget{reinterpret_cast<uintptr_t>(&gCanary), 0}));
    std::this_thread::sleep_for(200ms);  // the watchers look every millisecond
    out.rank1Saw = report->rank1Saw.load();
    out.thirdSaw = report->thirdSaw.load();
    report->stop.store(1);
  }
  int status = 0;
  ::waitpid(out.rank1Pid, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "rank 1 failed: " << status;
  if (const int third = report->thirdPid.load(); third > 0) ::kill(third, SIGKILL);
  setLogSink(nullptr);
  ::munmap(report, sizeof(Report));
  std::remove(path.c_str());
  return out;
}

// The honest pair: rank 1's hello comes from the pid its record gives, so
// rank 0's single-copy write lands in rank 1's process.
TEST(ShmIdentity, APeerWhoseHelloMatchesItsRecordGetsSingleCopyWrites) {
  const Outcome out = run(Mode::Honest);
  EXPECT_TRUE(out.described.ends_with("single-copy writes on")) << out.described;
  EXPECT_EQ(out.rank1Saw, kWritten) << "the single-copy write did not reach rank 1";
}

// Rank 1's record gives the pid of a third process that maps rank 1's
// segment at the same address (it passes the nonce check). Its hello comes
// from rank 1's own pid, so rank 0 writes nothing into the third process:
// the payload goes through the slots, and the mismatch is logged naming
// both pids.
TEST(ShmIdentity, ARecordGivingAThirdProcesssPidGetsNoSingleCopyWrites) {
  const Outcome out = run(Mode::ForgedPid);
  EXPECT_NE(out.thirdSaw, kWritten) << "rank 0 wrote into the third process";
  EXPECT_NE(out.rank1Saw, kWritten);
  EXPECT_TRUE(out.described.ends_with("waiting for its hello from its pid")) << out.described;
  bool named = false;
  for (const auto& line : out.warnings) {
    named = named || line.find(fmt::format("came from pid {}", out.rank1Pid)) != std::string::npos;
  }
  EXPECT_TRUE(named) << "no warning names the pid the hello came from";
}

// A local process sends rank 0's doorbell what it likes: a wrong magic, a
// rank out of range, rank 0's own, datagrams too short and too long, and a
// hello as rank 1 from its own pid. None of it is taken: the ranks are named
// in warnings, the false rank 1 is logged with its pid, rank 0 keeps
// working, and rank 1's genuine hello still turns single-copy writes on.
TEST(ShmIdentity, CraftedHellosAreRefusedAndTheGenuineOneStillCounts) {
  const Outcome out = run(Mode::CraftedHellos);
  EXPECT_TRUE(out.described.ends_with("single-copy writes on")) << out.described;
  EXPECT_EQ(out.rank1Saw, kWritten) << "the single-copy write did not reach rank 1";
  EXPECT_NE(out.thirdSaw, kWritten);
  auto warned = [&](const std::string& text) {
    for (const auto& line : out.warnings) {
      if (line.find(text) != std::string::npos) return true;
    }
    return false;
  };
  EXPECT_TRUE(warned("as rank 7, which is no local peer")) << "rank 7 not named";
  EXPECT_TRUE(warned("as rank 4294967295, which is no local peer")) << "rank -1 not named";
  EXPECT_TRUE(warned("as rank 0, which is no local peer")) << "rank 0's own rank not named";
  EXPECT_TRUE(warned("a hello as rank 1 came from pid ")) << "the false rank 1 not logged";
}

}  // namespace
}  // namespace rdmacc
