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
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "rdmacc/log.hpp"
#include "rdmacc/store.hpp"
#include "src/store/store_util.hpp"
#include "src/transport/options.hpp"
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
  std::atomic<int> stop{0};
};

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
// refused by a full queue) and watches. `hostile`: publishes the pid of a
// child forked after its segment was mapped.
[[noreturn]] void rank1(const std::string& path, const std::string& group, bool hostile,
                        Report& report) {
  try {
    FileStore store(path, 20s);
    TransportOptions o = optionsFor(group, 1);
    if (hostile) {
      o.allGather = [&](const std::string& prefix, const Bytes& mine,
                        const std::vector<int>& participants, const std::vector<int>& wanted) {
        const pid_t third = ::fork();
        if (third == 0) {
          watch(report.thirdSaw, report);
          ::_exit(0);
        }
        report.thirdPid.store(third);
        const std::string record = toString(mine);
        const std::string forged = fmt::format("{}:{}", record.substr(0, record.find(':')), third);
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
// be on, then writes kWritten single-copy to gCanary in "rank 1's" process.
Outcome run(bool hostile) {
  const std::string group =
      fmt::format("identity-{}-{}", ::getpid(), hostile ? "hostile" : "honest");
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
  if (out.rank1Pid == 0) rank1(path, group, hostile, *report);
  {
    FileStore store(path, 20s);
    auto transport = makeShmTransport(store, optionsFor(group, 0), {true, true});
    const auto deadline = std::chrono::steady_clock::now() + 3s;
    do {
      transport->consumeEvents();
      out.described = transport->describePeer(1);
      std::this_thread::sleep_for(1ms);
    } while (!out.described.ends_with("writes on") && std::chrono::steady_clock::now() < deadline);
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
  const Outcome out = run(/*hostile=*/false);
  EXPECT_TRUE(out.described.ends_with("single-copy writes on")) << out.described;
  EXPECT_EQ(out.rank1Saw, kWritten) << "the single-copy write did not reach rank 1";
}

// Rank 1's record gives the pid of a third process that maps rank 1's
// segment at the same address (it passes the nonce check). Its hello comes
// from rank 1's own pid, so rank 0 writes nothing into the third process:
// the payload goes through the slots, and the mismatch is logged naming
// both pids.
TEST(ShmIdentity, ARecordGivingAThirdProcesssPidGetsNoSingleCopyWrites) {
  const Outcome out = run(/*hostile=*/true);
  EXPECT_NE(out.thirdSaw, kWritten) << "rank 0 wrote into the third process";
  EXPECT_NE(out.rank1Saw, kWritten);
  EXPECT_TRUE(out.described.ends_with("waiting for its hello from its pid")) << out.described;
  bool named = false;
  for (const auto& line : out.warnings) {
    named = named || line.find(fmt::format("came from pid {}", out.rank1Pid)) != std::string::npos;
  }
  EXPECT_TRUE(named) << "no warning names the pid the hello came from";
}

}  // namespace
}  // namespace rdmacc
