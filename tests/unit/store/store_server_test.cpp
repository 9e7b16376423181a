// The TCP store server against clients that misbehave: malformed frames,
// replies never read, frames never finished, descriptors running out, many
// waiters, floods of warnings. One bad client must not take down rank 0 (the
// server's host) nor slow the others.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "rdmacc/error.hpp"
#include "rdmacc/log.hpp"
#include "rdmacc/store.hpp"
#include "src/store/protocol.hpp"
#include "src/store/socket.hpp"

namespace rdmacc {
namespace {

using namespace std::chrono_literals;
namespace sp = store_protocol;

net::Fd connectRaw(uint16_t port) {
  int err = 0;
  std::string detail;
  auto fd = net::tryConnectTcp("127.0.0.1", port, net::Clock::now() + 5s, err, detail);
  EXPECT_TRUE(fd) << detail;
  return fd;
}

// Whether the server closed `fd` within `within` (EOF or reset).
bool closedWithin(int fd, std::chrono::milliseconds within) {
  uint8_t buf[16];
  try {
    net::recvAll(fd, buf, sizeof buf, net::Clock::now() + within);
    return false;
  } catch (const Error&) {
    return true;
  }
}

// Sends raw bytes to the server and reports whether it closed the connection.
bool serverDrops(uint16_t port, const std::vector<uint8_t>& bytes) {
  auto fd = connectRaw(port);
  ::send(fd.get(), bytes.data(), bytes.size(), MSG_NOSIGNAL);
  return closedWithin(fd.get(), 2s);
}

std::vector<uint8_t> frame(std::vector<uint8_t> body) {
  std::vector<uint8_t> out(4 + body.size());
  for (size_t k = 0; k < 4; ++k) out[k] = static_cast<uint8_t>(body.size() >> (8 * k));
  std::copy(body.begin(), body.end(), out.begin() + 4);
  return out;
}

// The start of a Set frame announcing `valueBytes` of value, and `sent` of them.
std::vector<uint8_t> unfinishedSet(uint32_t valueBytes, size_t sent) {
  auto full = sp::encode(
      sp::Request{.command = sp::Command::Set, .keys = {"k"}, .value = Bytes(valueBytes, 1)});
  full.resize(full.size() - valueBytes + sent);
  return full;
}

TEST(TCPStoreServer, MalformedFramesDropOnlyThatClient) {
  TCPStoreServer server("127.0.0.1", 0);
  TCPStore good("127.0.0.1", server.port(), TCPStoreOptions{.timeout = 2s});
  good.set("survivor", toBytes("yes"));
  // Oversized frame length.
  EXPECT_TRUE(serverDrops(server.port(), {0xff, 0xff, 0xff, 0xff, 1, 2, 3}));
  // Zero-length frame.
  EXPECT_TRUE(serverDrops(server.port(), {0, 0, 0, 0}));
  // Unknown command.
  EXPECT_TRUE(serverDrops(server.port(), frame({99, 0, 0, 0, 0})));
  // Key length larger than the frame.
  EXPECT_TRUE(serverDrops(server.port(), frame({2, 0xff, 0xff, 0, 0, 'a'})));
  // Key over the key limit.
  EXPECT_TRUE(serverDrops(server.port(), frame({2, 0x00, 0x20, 0, 0, 'a'})));
  // Trailing bytes after a valid GET.
  EXPECT_TRUE(serverDrops(server.port(), frame({2, 1, 0, 0, 0, 'a', 'x'})));
  // Too many keys in a CHECK.
  EXPECT_TRUE(serverDrops(server.port(), frame({4, 0xff, 0xff, 0xff, 0x7f})));
  // The well-behaved client never noticed.
  EXPECT_EQ(toString(good.get("survivor")), "yes");
  good.set("still", toBytes("serving"));
  EXPECT_EQ(toString(good.get("still")), "serving");
}

size_t residentBytes() {
  long pages = 0, resident = 0;
  FILE* f = std::fopen("/proc/self/statm", "r");
  if (f == nullptr) return 0;
  if (std::fscanf(f, "%ld %ld", &pages, &resident) != 2) resident = 0;
  std::fclose(f);
  return static_cast<size_t>(resident) * static_cast<size_t>(::sysconf(_SC_PAGESIZE));
}

// 400 pipelined Gets of a 4 MiB value from a client that never reads: the
// replies used to pile up in the server (1.6 GiB; std::bad_alloc escaped the
// server thread and terminated rank 0). Now the server stops reading that
// client while its replies wait, and serves everyone else meanwhile.
TEST(TCPStoreServer, AClientThatNeverReadsRepliesCannotExhaustTheServer) {
  TCPStoreServer server("127.0.0.1", 0);
  TCPStore good("127.0.0.1", server.port(), TCPStoreOptions{.timeout = 5s});
  good.set("big", Bytes(4u << 20, 7));
  const size_t before = residentBytes();
  int errnum = 0;
  std::string detail;
  net::Fd greedy =
      net::tryConnectTcp("127.0.0.1", server.port(), net::Clock::now() + 5s, errnum, detail);
  ASSERT_TRUE(greedy) << detail;
  auto get = sp::encode(sp::Request{.command = sp::Command::Get, .keys = {"big"}});
  std::vector<uint8_t> pipelined;
  for (int i = 0; i < 400; ++i) pipelined.insert(pipelined.end(), get.begin(), get.end());
  net::setNonBlocking(greedy.get());
  size_t sent = 0;
  for (int tries = 0; tries < 200 && sent < pipelined.size(); ++tries) {
    ssize_t n =
        ::send(greedy.get(), pipelined.data() + sent, pipelined.size() - sent, MSG_NOSIGNAL);
    if (n > 0) sent += static_cast<size_t>(n);
    std::this_thread::sleep_for(5ms);
  }
  // The good client is served throughout.
  for (int i = 0; i < 20; ++i) {
    good.set("tick", toBytes(std::to_string(i)));
    EXPECT_EQ(toString(good.get("tick")), std::to_string(i));
  }
  EXPECT_EQ(good.get("big").size(), 4u << 20);
  const size_t grown = residentBytes() - std::min(before, residentBytes());
  EXPECT_LT(grown, size_t{256} << 20) << "the server buffered " << (grown >> 20) << " MiB";
}

TEST(TCPStoreServer, ClientVanishingWhileBlockedIsHarmless) {
  TCPStoreServer server("127.0.0.1", 0);
  {
    TCPStore waiter("127.0.0.1", server.port(), TCPStoreOptions{.timeout = 100ms});
    EXPECT_THROW(waiter.get("never"), Error);
  }
  TCPStore client("127.0.0.1", server.port(), TCPStoreOptions{.timeout = 2s});
  client.set("never", toBytes("now"));
  EXPECT_EQ(toString(client.get("never")), "now");
}

// A client that sends part of a frame and then nothing is dropped after the
// idle limit, which frees what the server held for it (four such clients
// used to hold 437 MiB for ever); the others are served throughout.
TEST(TCPStoreServer, AHalfSentFrameExpires) {
  TCPStoreServer server("127.0.0.1", 0, {}, TCPStoreServer::Limits{.partialFrameIdle = 300ms});
  TCPStore good("127.0.0.1", server.port(), TCPStoreOptions{.timeout = 2s});
  auto idle = connectRaw(server.port());
  auto part = unfinishedSet(1u << 20, 4096);
  ASSERT_EQ(::send(idle.get(), part.data(), part.size(), MSG_NOSIGNAL),
            static_cast<ssize_t>(part.size()));
  good.set("during", toBytes("served"));
  EXPECT_EQ(toString(good.get("during")), "served");
  EXPECT_TRUE(closedWithin(idle.get(), 5s)) << "the half-sent frame was kept";
  good.set("after", toBytes("served"));
  EXPECT_EQ(toString(good.get("after")), "served");
}

// Partial frames of all clients together stay within the input budget: the
// client that pushes the total over it is dropped, the others are served.
TEST(TCPStoreServer, HalfSentFramesShareOneInputBudget) {
  TCPStoreServer server("127.0.0.1", 0, {}, TCPStoreServer::Limits{.inputBudget = 1u << 20});
  TCPStore good("127.0.0.1", server.port(), TCPStoreOptions{.timeout = 2s});
  std::vector<net::Fd> hogs;
  for (int i = 0; i < 4; ++i) {
    hogs.push_back(connectRaw(server.port()));
    auto part = unfinishedSet(64u << 20, 400u << 10);  // 400 KiB of a 64 MiB Set
    ::send(hogs.back().get(), part.data(), part.size(), MSG_NOSIGNAL);
  }
  int dropped = 0;
  for (auto& h : hogs) dropped += closedWithin(h.get(), 500ms) ? 1 : 0;
  EXPECT_GE(dropped, 2) << "4 x 400 KiB held against a 1 MiB budget";
  good.set("k", toBytes("v"));
  EXPECT_EQ(toString(good.get("k")), "v");
}

long cpuMillis() {
  rusage ru{};
  ::getrusage(RUSAGE_SELF, &ru);
  return (ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) * 1000 +
         (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1000;
}

// Out of file descriptors, a pending connection keeps the listener readable:
// the server used to spin at 100% CPU and starve its clients. It now takes
// such a connection with a spare descriptor and closes it (and, since
// accept4 fails with EMFILE even when nothing is pending, stops there: it
// used to loop in accept for ever once the queue was empty).
TEST(TCPStoreServer, OutOfDescriptorsRefusesWithoutSpinning) {
#if defined(__SANITIZE_ADDRESS__)
  // ASan/UBSan probe memory through a pipe before reporting on it: with no
  // descriptor left they report a (false) invalid vptr. The plain and TSan
  // builds run this test.
  GTEST_SKIP() << "the sanitizer runtime needs file descriptors of its own";
#endif
  TCPStoreServer server("127.0.0.1", 0);
  TCPStore good("127.0.0.1", server.port(), TCPStoreOptions{.timeout = 2s});
  good.set("k", toBytes("before"));
  rlimit saved{};
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &saved), 0);
  // Use up the descriptors below a lowered limit, keeping a few for the
  // connections that are to be refused.
  int highest = 0;
  for (int fd = 0; fd < 4096; ++fd) {
    if (::fcntl(fd, F_GETFD) != -1) highest = fd;
  }
  rlimit low = saved;
  low.rlim_cur = static_cast<rlim_t>(highest + 40);
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &low), 0);
  std::vector<int> filler;
  while (true) {
    int fd = ::dup(0);
    if (fd < 0) break;
    filler.push_back(fd);
  }
  // Three descriptors back: the clients' sockets get them, the server's
  // accepts find none.
  for (int i = 0; i < 3 && !filler.empty(); ++i) {
    ::close(filler.back());
    filler.pop_back();
  }
  std::vector<int> refused;
  for (int i = 0; i < 3; ++i) {
    int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) break;
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(server.port());
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
    refused.push_back(fd);
  }
  const long before = cpuMillis();
  std::this_thread::sleep_for(1s);
  const long used = cpuMillis() - before;
  // The connected client is still served (its connection needs no new descriptor).
  good.set("k", toBytes("during"));
  EXPECT_EQ(toString(good.get("k")), "during");
  for (int fd : filler) ::close(fd);
  for (int fd : refused) ::close(fd);
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &saved), 0);
  EXPECT_LT(used, 500) << "the server spun on a listener it could not accept from";
  good.set("k", toBytes("after"));
  EXPECT_EQ(toString(good.get("k")), "after");
}

// docs/security.md: no client takes the store's memory past its budget.
// Eight clients each set 16 MiB against a 64 MiB budget: the sets past it
// fail for their client, naming the budget; the store keeps serving, and a
// delete makes room again. (Without the budget all eight were kept: 128 MiB.)
TEST(TCPStoreServer, TotalMemoryIsBoundedByTheBudget) {
  TCPStoreServer server("127.0.0.1", 0, "", TCPStoreServerLimits{.memoryBudget = size_t{64} << 20});
  const Bytes big(size_t{16} << 20, 7);
  std::vector<std::unique_ptr<TCPStore>> clients;
  int kept = 0;
  std::string refusal;
  for (int i = 0; i < 8; ++i) {
    clients.push_back(
        std::make_unique<TCPStore>("127.0.0.1", server.port(), TCPStoreOptions{.timeout = 10s}));
    try {
      clients.back()->set(fmt::format("big/{}", i), big);
      ++kept;
    } catch (const Error& e) {
      refusal = e.what();
    }
  }
  EXPECT_EQ(kept, 3);  // the fourth would pass 64 MiB with its key
  EXPECT_NE(refusal.find("the store is full"), std::string::npos) << refusal;
  EXPECT_NE(refusal.find("RDMACC_STORE_MEMORY"), std::string::npos) << refusal;
  TCPStore legit("127.0.0.1", server.port(), TCPStoreOptions{.timeout = 10s});
  EXPECT_EQ(legit.get("big/0").size(), big.size());
  EXPECT_TRUE(legit.check({"big/2"}));
  EXPECT_FALSE(legit.check({"big/3"}));
  EXPECT_TRUE(legit.deleteKey("big/1"));
  legit.set("small", toBytes("fits again"));
  EXPECT_EQ(toString(legit.get("small")), "fits again");
}

// docs/security.md: idle connections cannot lock the ranks out. With a key,
// a connection that never authenticates is closed after the deadline, and
// when every slot is taken by such connections a new client still gets in
// (the oldest unauthenticated one makes room); without a key the same for
// connections that never sent a byte.
TEST(TCPStoreServer, IdleConnectionsCannotLockOutTheRanks) {
  for (const std::string key : {"job secret", ""}) {
    SCOPED_TRACE(key.empty() ? "without a key" : "with a key");
    TCPStoreServer server("127.0.0.1", 0, key,
                          TCPStoreServerLimits{.authDeadline = 1500ms, .maxClients = 8});
    std::vector<net::Fd> idle;
    for (int i = 0; i < 8; ++i) idle.push_back(connectRaw(server.port()));
    std::this_thread::sleep_for(1200ms);  // past the quiet age of a connection without a key
    TCPStore rank("127.0.0.1", server.port(),
                  TCPStoreOptions{.timeout = 5s, .connectTimeout = 5s, .authKey = key});
    rank.set("k", toBytes("served"));
    EXPECT_EQ(toString(rank.get("k")), "served");
    EXPECT_TRUE(closedWithin(idle.front().get(), 100ms)) << "the oldest idle one made room";
    if (!key.empty()) {
      // The rest never authenticated: gone once the deadline passed.
      EXPECT_TRUE(closedWithin(idle.back().get(), 3s));
    }
    rank.set("k", toBytes("still served"));
    EXPECT_EQ(toString(rank.get("k")), "still served");
  }
}

// A client blocked in a Wait on many keys: every Set used to copy and look
// up all of them (75-300 ms per Set); waiters are indexed by key now.
TEST(TCPStoreServer, ABlockedWaitOnManyKeysDoesNotSlowSets) {
  TCPStoreServer server("127.0.0.1", 0);
  std::vector<std::string> keys;
  for (int i = 0; i < 60000; ++i) keys.push_back("wait/" + std::to_string(i));
  std::thread waiter([&] {
    TCPStore w("127.0.0.1", server.port(), TCPStoreOptions{.timeout = 60s});
    EXPECT_THROW(w.wait(keys, 3s), Error);
  });
  TCPStore setter("127.0.0.1", server.port(), TCPStoreOptions{.timeout = 10s});
  std::this_thread::sleep_for(300ms);  // the Wait is in
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < 1000; ++i) setter.set("other/" + std::to_string(i), toBytes("x"));
  const auto took = std::chrono::steady_clock::now() - start;
  waiter.join();
  EXPECT_LT(took, 5s) << "1000 Sets behind a Wait on 60000 keys";
}

// A flood of bad clients makes a few warning lines, not one per client.
TEST(TCPStoreServer, WarningsAboutBadClientsAreRateLimited) {
  std::mutex m;
  int lines = 0;
  const LogLevel level = logLevel();
  setLogLevel(LogLevel::Warn);
  setLogSink([&](LogLevel, std::string_view text) {
    if (text.find("store server:") != std::string_view::npos) {
      std::lock_guard lock(m);
      ++lines;
    }
  });
  {
    TCPStoreServer server("127.0.0.1", 0);
    for (int i = 0; i < 50; ++i) EXPECT_TRUE(serverDrops(server.port(), {0, 0, 0, 0}));
  }
  setLogSink(nullptr);
  setLogLevel(level);
  EXPECT_GE(lines, 1);
  EXPECT_LE(lines, 3) << "50 malformed clients";
}

}  // namespace
}  // namespace rdmacc
