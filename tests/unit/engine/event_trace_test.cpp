// RDMACC_TRACE_EVENTS: two ranks as two threads of this process (shared
// memory) record every stage of their operations, in order, into one file
// per rank when their backends go away; a file that cannot be written is
// reported, and the backend still goes away quietly.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "rdmacc/backend.hpp"
#include "rdmacc/log.hpp"
#include "rdmacc/store.hpp"
#include "src/engine/event_trace.hpp"

namespace rdmacc {
namespace {

using namespace std::chrono_literals;

struct Row {
  int64_t ns;
  std::string stage, kind;
  uint64_t sequence;
  int peer;
};

std::vector<Row> readTrace(const std::string& path) {
  std::ifstream in(path);
  std::vector<Row> rows;
  std::string line;
  EXPECT_TRUE(std::getline(in, line) && line.starts_with("# rdmacc event trace:")) << line;
  EXPECT_TRUE(std::getline(in, line) && line == "time_ns,stage,kind,sequence,peer,thread") << line;
  while (std::getline(in, line)) {
    std::istringstream fields(line);
    Row r;
    std::string ns, sequence, peer;
    std::getline(fields, ns, ',');
    std::getline(fields, r.stage, ',');
    std::getline(fields, r.kind, ',');
    std::getline(fields, sequence, ',');
    std::getline(fields, peer, ',');
    r.ns = std::stoll(ns);
    r.sequence = std::stoull(sequence);
    r.peer = std::stoi(peer);
    rows.push_back(r);
  }
  return rows;
}

// Forms a 2-rank shared-memory group with `config` on top, runs `body` on
// both ranks at once (as two threads), then destroys both backends.
void onTwoRanks(const std::string& group, std::map<std::string, std::string> config,
                const std::function<void(VerbsBackend&, int)>& body) {
  auto store = std::make_shared<HashStore>(10s);
  std::vector<std::unique_ptr<VerbsBackend>> ranks(2);
  config["RDMACC_TRANSPORT"] = "shm";
  config["RDMACC_HOST_ID"] = "same-host";
  std::vector<std::jthread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      auto& backend = ranks[static_cast<size_t>(r)];
      backend = std::make_unique<VerbsBackend>(
          store, r, 2, VerbsBackend::Options{.groupName = group, .config = config});
      body(*backend, r);
    });
  }
  threads.clear();  // joined
  ranks.clear();    // the traces are written
}

TEST(EventTrace, RecordsEveryStageOfEveryOperationInOrderPerRank) {
  const auto dir =
      std::filesystem::temp_directory_path() / ("rdmacc-trace-test-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  constexpr int kAllreduces = 5;
  constexpr uint32_t kTag = 7;
  onTwoRanks("traced", {{"RDMACC_TRACE_EVENTS", (dir / "trace.%r.csv").string()}},
             [&](VerbsBackend& backend, int rank) {
               for (int i = 0; i < kAllreduces; ++i) {
                 float value = 1;
                 std::vector<Tensor> t{Tensor{&value, 1, DataType::Float32}};
                 backend.allreduce(t)->wait();
                 EXPECT_EQ(value, 2.0f);
               }
               float word = 3;
               std::vector<Tensor> t{Tensor{&word, 1, DataType::Float32}};
               if (rank == 0) {
                 backend.send(t, 1, kTag)->wait();
               } else {
                 backend.recv(t, 0, kTag)->wait();
               }
             });

  for (int rank = 0; rank < 2; ++rank) {
    SCOPED_TRACE("rank " + std::to_string(rank));
    const std::vector<Row> rows = readTrace((dir / fmt::format("trace.{}.csv", rank)).string());
    // Every collective went through every stage, in this order.
    std::map<uint64_t, std::vector<const Row*>> collectives;
    for (const Row& r : rows) {
      if (r.kind == "collective") collectives[r.sequence].push_back(&r);
    }
    ASSERT_GE(collectives.size(), static_cast<size_t>(kAllreduces));
    for (const auto& [sequence, events] : collectives) {
      std::map<std::string, const Row*> at;
      for (const Row* r : events) at.emplace(r->stage, r);  // the first of each
      for (const char* stage :
           {"submit", "start", "post_begin", "post_end", "arrival", "done", "finish"}) {
        ASSERT_TRUE(at.count(stage)) << "collective #" << sequence << " has no " << stage;
      }
      EXPECT_LE(at["submit"]->ns, at["start"]->ns);
      EXPECT_LE(at["start"]->ns, at["post_begin"]->ns);
      EXPECT_LE(at["post_begin"]->ns, at["post_end"]->ns);
      EXPECT_LE(at["post_end"]->ns, at["done"]->ns);
      EXPECT_LE(at["arrival"]->ns, at["done"]->ns);
      EXPECT_LE(at["done"]->ns, at["finish"]->ns);
      EXPECT_EQ(at["post_begin"]->peer, 1 - rank);
      EXPECT_EQ(at["arrival"]->peer, 1 - rank);
    }
    // The point-to-point pair: rank 0 posted to rank 1 under its tag, rank
    // 1 saw it arrive from rank 0.
    std::map<std::string, const Row*> p2p;
    for (const Row& r : rows) {
      if (r.kind == "p2p" && r.sequence == kTag) p2p.emplace(r.stage, &r);
    }
    for (const char* stage : {"submit", "start", "finish"}) {
      EXPECT_TRUE(p2p.count(stage))
          << "the " << (rank == 0 ? "send" : "recv") << " has no " << stage;
    }
    if (rank == 0) {
      ASSERT_TRUE(p2p.count("post_end"));
      EXPECT_EQ(p2p["post_end"]->peer, 1);
    } else {
      ASSERT_TRUE(p2p.count("arrival"));
      EXPECT_EQ(p2p["arrival"]->peer, 0);
      EXPECT_LE(p2p["arrival"]->ns, p2p["finish"]->ns);
    }
  }
  std::filesystem::remove_all(dir);
}

// The error lines logged while `body` runs (from any thread).
std::vector<std::string> errorsLoggedBy(const std::function<void()>& body) {
  std::mutex mutex;
  std::vector<std::string> errors;
  setLogSink([&](LogLevel level, std::string_view line) {
    std::lock_guard lock(mutex);
    if (level == LogLevel::Error) errors.emplace_back(line);
  });
  body();
  setLogSink(nullptr);
  return errors;
}

TEST(EventTrace, AFileThatCannotBeWrittenIsReportedAndNothingElseFails) {
  const std::string path = "/nonexistent-rdmacc-dir/trace.%r.csv";
  const std::vector<std::string> errors = errorsLoggedBy([&] {
    EXPECT_NO_THROW(onTwoRanks("untraceable", {{"RDMACC_TRACE_EVENTS", path}},
                               [](VerbsBackend& backend, int) { backend.barrier()->wait(); }));
  });
  ASSERT_EQ(errors.size(), 2u);
  for (const std::string& e : errors) {
    EXPECT_NE(e.find("RDMACC_TRACE_EVENTS: cannot write /nonexistent-rdmacc-dir/trace."),
              std::string::npos)
        << e;
  }
}

// A name someone else planted as a symbolic link (in /tmp, say) is not
// followed: the file it points to is neither created nor overwritten.
TEST(EventTrace, ASymbolicLinkIsNotFollowed) {
  const auto dir =
      std::filesystem::temp_directory_path() / ("rdmacc-trace-link-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  for (int r = 0; r < 2; ++r) {
    std::filesystem::create_symlink(dir / fmt::format("victim.{}", r),
                                    dir / fmt::format("trace.{}.csv", r));
  }
  const std::vector<std::string> errors = errorsLoggedBy([&] {
    onTwoRanks("linked", {{"RDMACC_TRACE_EVENTS", (dir / "trace.%r.csv").string()}},
               [](VerbsBackend& backend, int) { backend.barrier()->wait(); });
  });
  EXPECT_EQ(errors.size(), 2u);
  EXPECT_FALSE(std::filesystem::exists(dir / "victim.0"));
  EXPECT_FALSE(std::filesystem::exists(dir / "victim.1"));
  std::filesystem::remove_all(dir);
}

TEST(EventTrace, PathPatternsNameTheRankHostAndProcess) {
  EXPECT_EQ(expandPathPattern("/tmp/t.%r.csv", 3), "/tmp/t.3.csv");
  EXPECT_EQ(expandPathPattern("/tmp/t.%r.csv"), "/tmp/t.%r.csv");  // no rank: left as it is
  EXPECT_EQ(expandPathPattern("%p"), std::to_string(::getpid()));
  EXPECT_EQ(expandPathPattern("100%%"), "100%");
  EXPECT_FALSE(expandPathPattern("%h").empty());
  EXPECT_NE(expandPathPattern("%h"), "%h");
}

}  // namespace
}  // namespace rdmacc
