// RDMACC_AUTH_KEY: the store's challenge-response, the key file's checks,
// the derived group token, and that the key is never shown.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "rdmacc/config.hpp"
#include "rdmacc/environment.hpp"
#include "rdmacc/error.hpp"
#include "rdmacc/store.hpp"
#include "src/store/auth.hpp"
#include "src/store/protocol.hpp"
#include "src/store/socket.hpp"

namespace rdmacc {
namespace {

using namespace std::chrono_literals;
namespace sp = store_protocol;
using Clock = std::chrono::steady_clock;

TCPStoreOptions withKey(std::string key) {
  return TCPStoreOptions{.timeout = 2s, .connectTimeout = 2s, .authKey = std::move(key)};
}

std::string messageOf(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(AuthKey, ClientsWithTheKeyAreServed) {
  TCPStoreServer server("127.0.0.1", 0, "job secret");
  TCPStore a("127.0.0.1", server.port(), withKey("job secret"));
  TCPStore b("127.0.0.1", server.port(), withKey("job secret"));
  a.set("k", toBytes("v"));
  EXPECT_EQ(toString(b.get("k")), "v");
  EXPECT_EQ(a.add("n", 2), 2);
  EXPECT_EQ(b.add("n", 3), 5);
  b.wait({"k"}, 1s);
}

TEST(AuthKey, AClientWithoutTheKeyIsToldWhatIsMissing) {
  TCPStoreServer server("127.0.0.1", 0, "job secret");
  TCPStore good("127.0.0.1", server.port(), withKey("job secret"));
  good.set("secret-ish", toBytes("token"));
  TCPStore stranger("127.0.0.1", server.port(), withKey(""));
  const std::string why = messageOf([&] { stranger.get("secret-ish"); });
  EXPECT_NE(why.find("requires authentication"), std::string::npos) << why;
  EXPECT_NE(why.find("RDMACC_AUTH_KEY"), std::string::npos) << why;
  EXPECT_EQ(toString(good.get("secret-ish")), "token");  // still served
}

TEST(AuthKey, AnotherKeyFailsAtConnectNamingTheProblem) {
  TCPStoreServer server("127.0.0.1", 0, "job secret");
  const auto start = Clock::now();
  const std::string why =
      messageOf([&] { TCPStore wrong("127.0.0.1", server.port(), withKey("other secret")); });
  EXPECT_NE(why.find("does not hold this process's key"), std::string::npos) << why;
  EXPECT_LT(Clock::now() - start, 1500ms);  // at once, not at the connect timeout
  TCPStore good("127.0.0.1", server.port(), withKey("job secret"));
  good.set("after", toBytes("fine"));
}

TEST(AuthKey, AKeyAgainstAStoreWithoutOneFailsAtOnce) {
  TCPStoreServer server("127.0.0.1", 0);
  const auto start = Clock::now();
  const std::string why =
      messageOf([&] { TCPStore keyed("127.0.0.1", server.port(), withKey("job secret")); });
  EXPECT_NE(why.find("during authentication"), std::string::npos) << why;
  EXPECT_NE(why.find("RDMACC_AUTH_KEY"), std::string::npos) << why;
  EXPECT_LT(Clock::now() - start, 1500ms);
}

// A raw client: connects, sends bytes, reports whether the server closed.
struct Raw {
  net::Fd fd;
  explicit Raw(uint16_t port) {
    int errnum = 0;
    std::string detail;
    fd = net::tryConnectTcp("127.0.0.1", port, net::Clock::now() + 2s, errnum, detail);
    EXPECT_TRUE(fd) << detail;
  }
  void send(const std::vector<uint8_t>& bytes) {
    ASSERT_TRUE(net::sendAll(fd.get(), bytes.data(), bytes.size(), net::Clock::now() + 2s));
  }
  // Reads until the server closes (true) or 2 s pass (false).
  bool closedByServer() {
    uint8_t buf[4096];
    const auto until = Clock::now() + 2s;
    while (Clock::now() < until) {
      const ssize_t n = ::recv(fd.get(), buf, sizeof buf, MSG_DONTWAIT);
      if (n == 0) return true;
      if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return true;
      std::this_thread::sleep_for(10ms);
    }
    return false;
  }
};

TEST(AuthKey, ForgedProofsAndOversizedFramesBeforeAuthenticationAreDropped) {
  TCPStoreServer server("127.0.0.1", 0, "job secret");
  TCPStore good("127.0.0.1", server.port(), withKey("job secret"));
  {  // a hello, then a proof made up without the key
    Raw forger(server.port());
    const auth::Nonce n = auth::nonce();
    forger.send(sp::encode(sp::AuthFrame{.tag = sp::AuthTag::Hello,
                                         .body = std::vector<uint8_t>(n.begin(), n.end())}));
    forger.send(sp::encode(
        sp::AuthFrame{.tag = sp::AuthTag::Proof, .body = std::vector<uint8_t>(auth::kMacBytes)}));
    EXPECT_TRUE(forger.closedByServer());
  }
  {  // a frame announcing 200 MiB before authenticating: dropped at the header
    Raw greedy(server.port());
    greedy.send({0x00, 0x00, 0x80, 0x0c, 2});
    EXPECT_TRUE(greedy.closedByServer());
  }
  {  // a proof before any hello
    Raw early(server.port());
    early.send(sp::encode(
        sp::AuthFrame{.tag = sp::AuthTag::Proof, .body = std::vector<uint8_t>(auth::kMacBytes)}));
    EXPECT_TRUE(early.closedByServer());
  }
  good.set("survivor", toBytes("yes"));
  EXPECT_EQ(toString(good.get("survivor")), "yes");
}

TEST(AuthKey, MacsAndGroupSecretsDependOnEveryInput) {
  const auth::Nonce a = auth::nonce(), b = auth::nonce();
  EXPECT_NE(a, b);
  const auth::Mac m = auth::mac("k", "label", a, b);
  EXPECT_EQ(m, auth::mac("k", "label", a, b));
  EXPECT_NE(m, auth::mac("k2", "label", a, b));
  EXPECT_NE(m, auth::mac("k", "label2", a, b));
  EXPECT_NE(m, auth::mac("k", "label", b, a));
  EXPECT_TRUE(auth::same(m, m.data()));
  auth::Mac other = m;
  other[31] ^= 1;
  EXPECT_FALSE(auth::same(m, other.data()));
  EXPECT_TRUE(auth::same(m, other.data(), 31));  // a prefix
  const std::string t = auth::groupSecret("k", "default", "salt");
  EXPECT_EQ(t.size(), 32u);
  EXPECT_EQ(t, auth::groupSecret("k", "default", "salt"));
  EXPECT_NE(t, auth::groupSecret("k", "torch-1", "salt"));
  EXPECT_NE(t, auth::groupSecret("k", "default", "salt2"));
  EXPECT_NE(t, auth::groupSecret("k2", "default", "salt"));
  const std::string h = auth::randomHex();
  EXPECT_EQ(h.size(), 64u);
  EXPECT_EQ(h.find_first_not_of("0123456789abcdef"), std::string::npos);
  EXPECT_NE(h, auth::randomHex());
}

std::string keyFile(const std::string& contents, mode_t mode) {
  static int n = 0;
  const std::string path =
      (std::filesystem::temp_directory_path() /
       ("rdmacc-key-" + std::to_string(::getpid()) + "-" + std::to_string(n++)))
          .string();
  std::filesystem::remove(path);
  std::ofstream(path) << contents;
  ::chmod(path.c_str(), mode);
  return path;
}

Config configWith(std::map<std::string, std::string> values) {
  return Config::load(values, {});
}

TEST(AuthKey, TheKeyFileMustBePrivateAndTheVariablesExclusive) {
  const std::string good = keyFile("c2VjcmV0IGtleQ==\n", 0600);
  EXPECT_EQ(authKey(configWith({{"RDMACC_AUTH_KEY_FILE", good}})), "c2VjcmV0IGtleQ==");
  EXPECT_EQ(authKey(configWith({{"RDMACC_AUTH_KEY", "inline"}})), "inline");
  EXPECT_EQ(authKey(configWith({})), "");

  const std::string open = keyFile("k\n", 0644);
  const std::string why = messageOf([&] { authKey(configWith({{"RDMACC_AUTH_KEY_FILE", open}})); });
  EXPECT_NE(why.find("group or others"), std::string::npos) << why;
  EXPECT_NE(why.find("chmod 600"), std::string::npos) << why;

  EXPECT_NE(messageOf([&] {
              authKey(configWith({{"RDMACC_AUTH_KEY", "a"}, {"RDMACC_AUTH_KEY_FILE", good}}));
            }).find("both"),
            std::string::npos);
  EXPECT_NE(messageOf([&] {
              authKey(configWith({{"RDMACC_AUTH_KEY_FILE", keyFile("\n", 0600)}}));
            }).find("empty"),
            std::string::npos);
  const std::string link = good + ".link";
  std::filesystem::create_symlink(good, link);
  EXPECT_NE(messageOf([&] {
              authKey(configWith({{"RDMACC_AUTH_KEY_FILE", link}}));
            }).find("cannot open"),
            std::string::npos);
  for (const auto& p : {good, open, link}) std::filesystem::remove(p);
}

TEST(AuthKey, TheKeyIsNeverShown) {
  const Config config = configWith({{"RDMACC_AUTH_KEY", "s3cret-value"}});
  EXPECT_EQ(config.shown("RDMACC_AUTH_KEY"), "(set)");
  for (const std::string& line : config.nonDefault()) {
    EXPECT_EQ(line.find("s3cret-value"), std::string::npos) << line;
  }
  EXPECT_EQ(configWith({}).shown("RDMACC_AUTH_KEY"), "");
}

}  // namespace
}  // namespace rdmacc
