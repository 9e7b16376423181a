#include <gtest/gtest.h>

#include <fmt/format.h>

#include <sys/resource.h>

#include <cerrno>

#include "rdmacc/error.hpp"
#include "src/transport/rdma/wr_id.hpp"
#include "verbs/error.hpp"

namespace rdmacc {
namespace {

TEST(Error, FormatsCallStatusPeerAndHint) {
  Error e(ErrorInfo{.kind = ErrorKind::Completion,
                    .message = "an RDMA write completed with an error",
                    .call = "ibv_poll_cq",
                    .errnum = 12,
                    .status = "transport retry counter exceeded",
                    .peerRank = 3,
                    .peerAddress = "192.168.77.1:4242",
                    .hint = "the peer died"});
  std::string w = e.what();
  EXPECT_EQ(
      w,
      "rdmacc: work completion error: an RDMA write completed with an error [ibv_poll_cq failed: "
      "transport retry counter exceeded (12)] [peer rank 3 at 192.168.77.1:4242] — hint: the peer "
      "died");
  EXPECT_EQ(e.peerRank(), 3);
  EXPECT_EQ(e.kind(), ErrorKind::Completion);
}

TEST(Error, ErrnoErrorUsesStrerror) {
  Error e = errnoError(ErrorKind::Registration, "ibv_reg_mr", ENOMEM, "cannot register 1 MiB",
                       "raise ulimit -l");
  EXPECT_NE(std::string(e.what()).find("ibv_reg_mr failed: Cannot allocate memory (12)"),
            std::string::npos)
      << e.what();
  EXPECT_NE(std::string(e.what()).find("raise ulimit -l"), std::string::npos);
}

TEST(Error, PlainMessageHasNoEmptyBrackets) {
  Error e(ErrorKind::Timeout, "waited too long");
  EXPECT_EQ(std::string(e.what()), "rdmacc: timeout: waited too long");
}

TEST(Error, RegistrationHintNamesTheLockedMemoryLimit) {
  rlimit saved{};
  ASSERT_EQ(getrlimit(RLIMIT_MEMLOCK, &saved), 0);
  rlimit low = saved;
  low.rlim_cur = 64 * 1024;
  if (saved.rlim_max != RLIM_INFINITY && saved.rlim_max < low.rlim_cur)
    low.rlim_cur = saved.rlim_max;
  ASSERT_EQ(setrlimit(RLIMIT_MEMLOCK, &low), 0);
  Error e = verbs::registrationError(ENOMEM, 1 << 20);
  setrlimit(RLIMIT_MEMLOCK, &saved);
  std::string w = e.what();
  EXPECT_EQ(e.kind(), ErrorKind::Registration);
  EXPECT_NE(w.find("cannot register 1048576 bytes"), std::string::npos) << w;
  EXPECT_NE(w.find(fmt::format("locked-memory limit is {} KiB (ulimit -l)", low.rlim_cur / 1024)),
            std::string::npos)
      << w;
  EXPECT_NE(w.find("unlimited"), std::string::npos) << w;
}

TEST(Error, CompletionErrorsNameStatusPeerAndHint) {
  ibv_wc wc{};
  wc.status = IBV_WC_RETRY_EXC_ERR;
  Error e = verbs::completionError(wc, 5, "192.168.77.1:1234", "an RDMA write");
  std::string w = e.what();
  EXPECT_EQ(e.kind(), ErrorKind::PeerFailure);
  EXPECT_EQ(e.peerRank(), 5);
  EXPECT_NE(w.find("transport retry counter exceeded"), std::string::npos) << w;
  EXPECT_NE(w.find("peer rank 5 at 192.168.77.1:1234"), std::string::npos) << w;
  EXPECT_NE(w.find("GID index"), std::string::npos) << w;
  wc.status = IBV_WC_REM_ACCESS_ERR;
  EXPECT_NE(std::string(verbs::completionError(wc, 1, "", "x").what()).find("remote key"),
            std::string::npos);
}

TEST(WrId, PacksEveryFieldWithoutLoss) {
  for (auto kind : {WrKind::Recv, WrKind::Write, WrKind::WriteImm, WrKind::Control}) {
    for (uint16_t peer : {0, 1, 255, 4096, 65535}) {
      for (uint32_t tag : {0u, 1u, 0x7fffffffu, 0xffffffffu}) {
        WrId w{kind, static_cast<uint8_t>(peer & 0xff), peer, tag};
        EXPECT_EQ(unpack(pack(w)), w);
      }
    }
  }
}

}  // namespace
}  // namespace rdmacc
