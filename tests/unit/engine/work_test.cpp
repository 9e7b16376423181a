// Work's contract without a device: completion, callbacks, and the one thing
// a callback must not do.
#include "rdmacc/work.hpp"

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <thread>

#include "rdmacc/error.hpp"
#include "src/engine/engine.hpp"

namespace rdmacc {
namespace {

using namespace std::chrono_literals;

// Waiting inside a completion callback for work that is not over used to
// hang forever (the callback runs on the only thread that could finish it).
TEST(Work, WaitingInsideACompletionCallbackIsRefusedWithAHint) {
  auto first = std::make_shared<Work>(OpType::Allreduce, 1);
  auto second = std::make_shared<Work>(OpType::Broadcast, 2);
  std::string refused, ownRefused;
  bool waitedOnFinished = false;
  first->then([&](Work& self) {
    try {
      second->wait(100ms);
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::InvalidArgument);
      refused = e.what();
    }
    try {
      self.wait();  // its own callbacks are still running
    } catch (const Error& e) {
      ownRefused = e.what();
    }
  });
  auto done = std::make_shared<Work>(OpType::Barrier, 3);
  done->finish(nullptr);
  second->then([&](Work&) { waitedOnFinished = done->wait(); });
  std::thread completer([&] { first->finish(nullptr); });
  completer.join();
  EXPECT_NE(refused.find("inside a completion callback"), std::string::npos) << refused;
  EXPECT_NE(refused.find("broadcast #2"), std::string::npos) << refused;
  EXPECT_NE(ownRefused.find("allreduce #1"), std::string::npos) << ownRefused;
  // Outside callbacks, and for work already over, waiting works.
  second->finish(nullptr);
  EXPECT_TRUE(waitedOnFinished);
  EXPECT_TRUE(first->wait());
  EXPECT_TRUE(second->wait(1s));
}

}  // namespace
}  // namespace rdmacc

namespace rdmacc {
namespace {

// The details are formatted only when asked for, from the values kept.
TEST(OperationDescription, FormatsTheKeptDetailsOnDemand) {
  Operation op;
  op.type = OpType::Allreduce;
  op.sequence = 12;
  EXPECT_EQ(op.description(), "allreduce #12");
  op.describe("{} x {}, {}, root {}", size_t{4099}, toString(DataType::Float32), "sum", -1);
  EXPECT_EQ(op.description(), "allreduce #12 (4099 x float32, sum, root -1)");
  op.describe("{} tensor(s)", 3u);
  EXPECT_EQ(op.description(), "allreduce #12 (3 tensor(s))");
}

}  // namespace
}  // namespace rdmacc
