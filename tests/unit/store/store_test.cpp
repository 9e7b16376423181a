#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <functional>
#include <random>
#include <thread>

#include "rdmacc/error.hpp"
#include "rdmacc/store.hpp"
#include "src/store/protocol.hpp"
#include "src/store/socket.hpp"
#include "src/store/store_util.hpp"

namespace rdmacc {
namespace {

using namespace std::chrono_literals;
namespace sp = store_protocol;

// Each parameter makes a fresh store and, for the shared-medium stores, a
// second client of the same store (what another rank would hold).
struct StoreFactory {
  std::string name;
  std::function<std::pair<std::shared_ptr<Store>, std::function<std::shared_ptr<Store>()>>()> make;
};

void PrintTo(const StoreFactory& f, std::ostream* os) {
  *os << f.name;
}

std::string tempPath() {
  static std::atomic<int> n{0};
  return (std::filesystem::temp_directory_path() /
          ("rdmacc-filestore-" + std::to_string(::getpid()) + "-" + std::to_string(n++)))
      .string();
}

std::vector<StoreFactory> factories() {
  return {
      {"Hash",
       [] {
         auto s = std::make_shared<HashStore>(2s);
         return std::pair<std::shared_ptr<Store>, std::function<std::shared_ptr<Store>()>>(
             s, [s] { return s; });
       }},
      {"File",
       [] {
         auto path = tempPath();
         std::filesystem::remove(path);
         auto s = std::make_shared<FileStore>(path, 2s);
         return std::pair<std::shared_ptr<Store>, std::function<std::shared_ptr<Store>()>>(
             s, [path] { return std::make_shared<FileStore>(path, 2s); });
       }},
      {"TCP",
       [] {
         auto s = std::make_shared<TCPStore>("127.0.0.1", 0,
                                             TCPStoreOptions{.isServer = true, .timeout = 2s});
         uint16_t port = s->port();
         return std::pair<std::shared_ptr<Store>, std::function<std::shared_ptr<Store>()>>(
             s, [port] {
               return std::make_shared<TCPStore>("127.0.0.1", port, TCPStoreOptions{.timeout = 2s});
             });
       }},
  };
}

class StoreTest : public ::testing::TestWithParam<StoreFactory> {};

TEST_P(StoreTest, SetGetCheckDelete) {
  auto [store, other] = GetParam().make();
  store->set("a", toBytes("hello"));
  EXPECT_EQ(toString(store->get("a")), "hello");
  auto peer = other();
  EXPECT_EQ(toString(peer->get("a")), "hello");
  EXPECT_TRUE(peer->check({"a"}));
  EXPECT_FALSE(peer->check({"a", "b"}));
  peer->set("a", toBytes("again"));
  EXPECT_EQ(toString(store->get("a")), "again");
  EXPECT_TRUE(store->deleteKey("a"));
  EXPECT_FALSE(store->deleteKey("a"));
  EXPECT_FALSE(peer->check({"a"}));
  store->set("empty", {});
  EXPECT_TRUE(store->get("empty").empty());
}

TEST_P(StoreTest, BinaryValuesSurvive) {
  auto [store, other] = GetParam().make();
  Bytes value(70000);
  for (size_t i = 0; i < value.size(); ++i) value[i] = static_cast<uint8_t>(i * 7);
  store->set("bin", value);
  EXPECT_EQ(other()->get("bin"), value);
}

TEST_P(StoreTest, AddIsAtomicAcrossClients) {
  auto [store, other] = GetParam().make();
  constexpr int kThreads = 4, kAdds = 50;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, client = other()] {
      for (int i = 0; i < kAdds; ++i) client->add("counter", 1);
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(store->add("counter", 0), kThreads * kAdds);
  EXPECT_EQ(store->add("counter", -5), kThreads * kAdds - 5);
  EXPECT_EQ(toString(store->get("counter")), std::to_string(kThreads * kAdds - 5));
  store->set("text", toBytes("nope"));
  EXPECT_THROW(store->add("text", 1), Error);
}

TEST_P(StoreTest, GetWaitsForASetFromAnotherClient) {
  auto [store, other] = GetParam().make();
  std::thread setter([client = other()] {
    std::this_thread::sleep_for(100ms);
    client->set("late", toBytes("here"));
  });
  EXPECT_EQ(toString(store->get("late")), "here");
  setter.join();
  store->wait({"late"}, 10ms);
}

TEST_P(StoreTest, WaitTimesOutNamingTheMissingKeys) {
  auto [store, other] = GetParam().make();
  store->set("present", toBytes("1"));
  auto start = std::chrono::steady_clock::now();
  try {
    store->wait({"present", "absent/7"}, 200ms);
    FAIL() << "wait returned";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Timeout);
    std::string w = e.what();
    EXPECT_NE(w.find("absent/7"), std::string::npos) << w;
    EXPECT_EQ(w.find("present"), std::string::npos) << w;
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
  store->setTimeout(100ms);
  EXPECT_THROW(store->get("never"), Error);
  // The store still works after a timeout.
  store->set("after", toBytes("ok"));
  EXPECT_EQ(toString(store->get("after")), "ok");
}

TEST_P(StoreTest, AddThatWouldOverflowIsAnErrorAndLeavesTheCounter) {
  auto [store, other] = GetParam().make();
  EXPECT_EQ(store->add("counter", INT64_MAX), INT64_MAX);
  try {
    other()->add("counter", 1);
    FAIL() << "add(INT64_MAX) + add(1) did not overflow";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("overflows a 64-bit counter"), std::string::npos)
        << e.what();
  }
  EXPECT_EQ(store->add("counter", 0), INT64_MAX);
  EXPECT_EQ(store->add("counter", INT64_MIN), -1);
  EXPECT_THROW(store->add("counter", INT64_MIN), Error);
}

TEST_P(StoreTest, PrefixStoreSeparatesGroups) {
  auto [store, other] = GetParam().make();
  PrefixStore a("group-a", store), b("group-b", store);
  a.set("k", toBytes("A"));
  b.set("k", toBytes("B"));
  EXPECT_EQ(toString(a.get("k")), "A");
  EXPECT_EQ(toString(b.get("k")), "B");
  EXPECT_EQ(toString(store->get("group-a/k")), "A");
  EXPECT_TRUE(a.check({"k"}));
  EXPECT_TRUE(a.deleteKey("k"));
  EXPECT_FALSE(a.check({"k"}));
  EXPECT_TRUE(b.check({"k"}));
}

TEST_P(StoreTest, MultiGetReturnsEveryValueInOrderOnceAllExist) {
  auto [store, other] = GetParam().make();
  store->set("m/0", toBytes("zero"));
  store->set("m/2", Bytes{});  // an empty value is a value
  std::thread setter([client = other()] {
    std::this_thread::sleep_for(100ms);
    client->set("m/1", toBytes("one"));
  });
  const auto values = store->multiGet({"m/1", "m/0", "m/2", "m/0"});
  setter.join();
  ASSERT_EQ(values.size(), 4u);
  EXPECT_EQ(toString(values[0]), "one");
  EXPECT_EQ(toString(values[1]), "zero");
  EXPECT_TRUE(values[2].empty());
  EXPECT_EQ(toString(values[3]), "zero");
  EXPECT_TRUE(store->multiGet({}).empty());
  PrefixStore group("g", store);
  group.set("a", toBytes("A"));
  EXPECT_EQ(toString(group.multiGet({"a"}).at(0)), "A");
  try {
    store->multiGet({"m/0", "m/absent"}, 200ms);
    FAIL() << "multiGet of a missing key returned";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Timeout);
    EXPECT_NE(std::string(e.what()).find("m/absent"), std::string::npos) << e.what();
  }
}

INSTANTIATE_TEST_SUITE_P(All, StoreTest, ::testing::ValuesIn(factories()),
                         [](const auto& p) { return p.param.name; });

// Rank 0 listens where MASTER_ADDR points, not on every interface: a
// loopback address keeps the store on this host; an address of one of its
// interfaces is bound exactly; anything else (a name that resolves to a
// loopback alias here, a NAT address) falls back to every interface.
TEST(TCPStore, TheServerBindsToMasterAddrWhenItIsOurs) {
  std::string why;
  EXPECT_EQ(net::storeBindAddress("127.0.0.1", why), "127.0.0.1");
  EXPECT_NE(why.find("loopback"), std::string::npos) << why;
  EXPECT_EQ(net::storeBindAddress("127.0.0.2", why), "127.0.0.2");
  EXPECT_EQ(net::storeBindAddress("localhost", why), "localhost");
  EXPECT_EQ(net::storeBindAddress("203.0.113.77", why), "0.0.0.0");  // TEST-NET-3: not ours
  EXPECT_NE(why.find("not an address of this host's interfaces"), std::string::npos) << why;
  // An address of one of this host's interfaces, if it has one besides lo.
  ifaddrs* all = nullptr;
  ASSERT_EQ(::getifaddrs(&all), 0);
  std::string mine;
  for (ifaddrs* i = all; i != nullptr && mine.empty(); i = i->ifa_next) {
    if (i->ifa_addr == nullptr || i->ifa_addr->sa_family != AF_INET) continue;
    std::array<char, INET_ADDRSTRLEN> text{};
    ::inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(i->ifa_addr)->sin_addr, text.data(),
                text.size());
    if (!std::string(text.data()).starts_with("127.")) mine = text.data();
  }
  ::freeifaddrs(all);
  if (mine.empty()) GTEST_SKIP() << "no IPv4 address besides loopback here";
  EXPECT_EQ(net::storeBindAddress(mine, why), mine) << why;
  // And a store server on it is reachable there and only there.
  TCPStore server(mine, 0, TCPStoreOptions{.isServer = true, .timeout = 5s});
  TCPStore client(mine, server.port(), TCPStoreOptions{.timeout = 5s});
  client.set("k", toBytes("v"));
  EXPECT_EQ(toString(server.get("k")), "v");
  int errnum = 0;
  std::string detail;
  auto refused =
      net::tryConnectTcp("127.0.0.1", server.port(), net::Clock::now() + 2s, errnum, detail);
  EXPECT_FALSE(refused) << "the store also listens on loopback";
}

TEST(TCPStore, UnreachableServerNamesHostAndPort) {
  // A port with nothing listening: bind, learn the port, close.
  uint16_t port = 0;
  {
    auto fd = net::listenTcp("127.0.0.1", 0);
    port = net::localPort(fd.get());
  }
  auto start = std::chrono::steady_clock::now();
  try {
    TCPStore store("127.0.0.1", port, TCPStoreOptions{.timeout = 1s, .connectTimeout = 300ms});
    FAIL() << "connected to nothing";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Store);
    EXPECT_NE(std::string(e.what()).find("127.0.0.1:" + std::to_string(port)), std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("MASTER_ADDR"), std::string::npos) << e.what();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
}

// A server whose accept queue is full (it never accepts): the kernel drops
// the SYNs, and a blocking connect() waited out its retries (12 s and more
// with a 1 s connect timeout). The connect timeout bounds the whole attempt.
TEST(TCPStore, AFullBacklogDoesNotOutlastTheConnectTimeout) {
  auto listener = net::listenTcp("127.0.0.1", 0, /*backlog=*/1);
  const uint16_t port = net::localPort(listener.get());
  std::vector<net::Fd> queued;
  for (int i = 0; i < 8; ++i) {  // fill the queue; later SYNs go unanswered
    net::Fd fd(::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(port);
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    (void)::connect(fd.get(), reinterpret_cast<const sockaddr*>(&addr), sizeof addr);
    queued.push_back(std::move(fd));
  }
  auto start = std::chrono::steady_clock::now();
  try {
    TCPStore store("127.0.0.1", port, TCPStoreOptions{.timeout = 1s, .connectTimeout = 1s});
    // The queue had room after all (kernels differ in how many they keep):
    // then the store's first request times out instead, also bounded.
    store.set("k", toBytes("v"));
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Store) << e.what();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
}

// A server that accepts but never answers: wait() on several keys fails
// after its timeout and a short diagnosis, not 5 s more per key.
TEST(TCPStore, WaitOnAMuteServerTakesItsTimeoutNotMorePerKey) {
  auto listener = net::listenTcp("127.0.0.1", 0);  // the kernel accepts; nobody reads
  const uint16_t port = net::localPort(listener.get());
  TCPStore store("127.0.0.1", port, TCPStoreOptions{.timeout = 1s, .connectTimeout = 1s});
  auto start = std::chrono::steady_clock::now();
  EXPECT_THROW(store.wait({"a", "b", "c", "d"}, 500ms), Error);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 4s);
}

TEST(TCPStore, ServerGoneIsAClearErrorAndClientReconnects) {
  auto server = std::make_unique<TCPStoreServer>("127.0.0.1", 0);
  uint16_t port = server->port();
  TCPStore client("127.0.0.1", port, TCPStoreOptions{.timeout = 1s, .connectTimeout = 300ms});
  client.set("k", toBytes("v"));
  server.reset();
  EXPECT_THROW(client.get("k"), Error);
  // A new server on the same port: the next call reconnects.
  server = std::make_unique<TCPStoreServer>("127.0.0.1", port);
  client.set("k2", toBytes("v2"));
  EXPECT_EQ(toString(client.get("k2")), "v2");
}

// One client shared by threads (as c10d's TCPStore is): a thread blocked in
// get() does not hold up another thread's set(), even of the key it waits
// for (it used to wait behind the get until its timeout), and setTimeout()
// while they run is safe.
TEST(TCPStore, ThreadsSharingAClientDoNotWaitForEachOther) {
  TCPStore store("127.0.0.1", 0, TCPStoreOptions{.isServer = true, .timeout = 5s});
  const auto start = std::chrono::steady_clock::now();
  std::thread waiter([&] { EXPECT_EQ(toString(store.get("late")), "here"); });
  std::this_thread::sleep_for(100ms);
  store.setTimeout(4s);
  store.set("unrelated", toBytes("x"));
  store.set("late", toBytes("here"));
  waiter.join();
  EXPECT_LT(std::chrono::steady_clock::now() - start, 2s);
  EXPECT_EQ(store.timeout(), 4s);
}

// A value whose length does not fit the frame's 32-bit fields is refused
// before anything is sent (it used to be cast to uint32 and desynchronise
// the stream); the connection stays usable.
TEST(TCPStore, ValuesBeyondTheProtocolLimitAreRefusedBeforeSending) {
  TCPStoreServer server("127.0.0.1", 0);
  TCPStore client("127.0.0.1", server.port(), TCPStoreOptions{.timeout = 5s});
  Bytes big(sp::kMaxValueBytes + 1, 1);
  try {
    client.set("big", big);
    FAIL() << "a value over the limit was sent";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::InvalidArgument);
    EXPECT_NE(std::string(e.what()).find("for key 'big'"), std::string::npos) << e.what();
  }
  EXPECT_THROW(client.get(std::string(sp::kMaxKeyBytes + 1, 'k')), Error);
  client.set("after", toBytes("fine"));
  EXPECT_EQ(toString(client.get("after")), "fine");
}

// One record the reader refuses would make the file unreadable for every
// rank: a value over the limit is refused before it is written.
TEST(FileStore, AValueOverTheRecordLimitIsRefusedAndTheStoreStillWorks) {
  auto path = tempPath();
  std::filesystem::remove(path);
  FileStore store(path, 2s);
  Bytes big(sp::kMaxValueBytes + 1, 1);
  try {
    store.set("big", big);
    FAIL() << "a value over the limit was written";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::InvalidArgument);
    EXPECT_NE(std::string(e.what()).find("'big'"), std::string::npos) << e.what();
  }
  big = {};
  store.set("after", toBytes("fine"));
  FileStore other(path, 2s);
  EXPECT_EQ(toString(other.get("after")), "fine");
  std::filesystem::remove(path);
}

TEST(FileStore, IsPrivateToItsUserAndRefusesASymlink) {
  auto path = tempPath();
  std::filesystem::remove(path);
  { FileStore store(path, 2s); }
  struct stat st {};
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  auto link = path + ".link";
  std::filesystem::remove(link);
  std::filesystem::create_symlink(path, link);
  EXPECT_THROW(FileStore(link, 2s), Error);
  std::filesystem::remove(link);
  // docs/security.md: a file others may write (planted, or loosened) is refused
  // naming it, and so is one of another user.
  ASSERT_EQ(::chmod(path.c_str(), 0666), 0);
  try {
    FileStore planted(path, 2s);
    ADD_FAILURE() << "a world-writable file store was used";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
  }
  ASSERT_EQ(::chmod(path.c_str(), 0600), 0);
  if (::geteuid() == 0) {  // CI runs as root: it can plant a file of another user
    ASSERT_EQ(::chown(path.c_str(), 65534, 65534), 0);
    EXPECT_THROW(FileStore(path, 2s), Error);
  }
  std::filesystem::remove(path);
}

// docs/security.md: a file store's size is not trusted for an allocation.
TEST(FileStore, AFileGrownPastTheLimitIsRefusedNamingIt) {
  auto path = tempPath();
  std::filesystem::remove(path);
  {
    FileStore store(path, 2s);
    store.set("a", toBytes("1"));
  }
  ASSERT_EQ(::truncate(path.c_str(), off_t{64} << 30), 0);  // sparse: 64 GiB of zeros
  try {
    FileStore store(path, 2s);
    store.get("a");
    ADD_FAILURE() << "a 64 GiB file store was read";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("68719476736 bytes"), std::string::npos) << e.what();
  }
  std::filesystem::remove(path);
}

TEST(StoreNumber, OnlyDigitsWithinTheRangeAreAccepted) {
  EXPECT_EQ(storeNumber(toBytes("4791"), 65535, "addr/1"), 4791u);
  EXPECT_EQ(storeNumber(toBytes("18446744073709551615"), UINT64_MAX, "token"), UINT64_MAX);
  for (const char* bad : {"", "-1", "65536", "12ab", " 1", "1 ", "0x10", "99999999999999999999"}) {
    try {
      storeNumber(toBytes(bad), 65535, "addr/1");
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::Protocol);
      EXPECT_NE(std::string(e.what()).find("key 'addr/1' holds"), std::string::npos) << e.what();
    }
  }
}

// A MultiGet reply is count length-prefixed values, exactly: anything else
// (short, long, a length past the end) is refused, never read past.
TEST(StoreProtocol, MultiGetValuesRoundTripAndMalformedOnesAreRefused) {
  const std::vector<Bytes> values{toBytes("a"), {}, toBytes("ccc")};
  const Bytes encoded = sp::encodeValues(values);
  EXPECT_EQ(sp::decodeValues(encoded, 3), values);
  EXPECT_FALSE(sp::decodeValues(encoded, 2));  // bytes left over
  EXPECT_FALSE(sp::decodeValues(encoded, 4));  // one missing
  Bytes lying = encoded;
  lying[0] = 0xff;  // the first length points past the end
  EXPECT_FALSE(sp::decodeValues(lying, 3));
  EXPECT_FALSE(sp::decodeValues(Bytes{1, 0}, 1));  // a length cut short
}

TEST(StoreProtocol, RandomBytesNeverCrashTheDecoder) {
  std::mt19937 rng(42);
  for (int i = 0; i < 20000; ++i) {
    std::vector<uint8_t> bytes(rng() % 64);
    for (auto& b : bytes) b = static_cast<uint8_t>(rng());
    if (bytes.size() >= 4 && (i % 2) == 0) {  // plausible lengths reach the body parser
      uint32_t len = static_cast<uint32_t>(bytes.size() - 4);
      for (int k = 0; k < 4; ++k)
        bytes[static_cast<size_t>(k)] = static_cast<uint8_t>(len >> (8 * k));
    }
    sp::Request req;
    auto r = sp::decode(bytes.data(), bytes.size(), req);
    if (r.state == sp::Decode::Ok) {
      EXPECT_LE(r.consumed, bytes.size());
    }
    sp::Response resp;
    sp::decode(bytes.data(), bytes.size(), resp);
  }
}

TEST(StoreProtocol, RequestsRoundTripAndSplitFramesNeedMore) {
  sp::Request req{.command = sp::Command::Wait, .keys = {"a", "bb", ""}};
  auto bytes = sp::encode(req);
  for (size_t cut = 0; cut < bytes.size(); ++cut) {
    sp::Request out;
    EXPECT_EQ(sp::decode(bytes.data(), cut, out).state, sp::Decode::NeedMore) << cut;
  }
  sp::Request out;
  auto r = sp::decode(bytes.data(), bytes.size(), out);
  ASSERT_EQ(r.state, sp::Decode::Ok);
  EXPECT_EQ(r.consumed, bytes.size());
  EXPECT_EQ(out.keys, req.keys);
  EXPECT_EQ(out.command, sp::Command::Wait);
}

}  // namespace
}  // namespace rdmacc
