// libFuzzer target for the TCP store server: every input is a script of
// connections to a real TCPStoreServer (in this process, over loopback) that
// send arbitrary bytes, split at arbitrary points, half-close, close, or first
// authenticate properly and then send arbitrary requests. After each script a
// legitimate client must still be served (set, get, add) by both servers: one
// with a key (RDMACC_AUTH_KEY) and one without. ASan+UBSan watch the server
// thread meanwhile; a crash, a leak report or a wrong answer is a finding.
//
//   cmake -S . -B build-fuzz -DCMAKE_CXX_COMPILER=clang++ -DRDMACC_FUZZ=ON
//   ninja -C build-fuzz rdmacc_store_server_fuzz &&
//   build-fuzz/tests/fuzz/rdmacc_store_server_fuzz -max_total_time=60
#include <poll.h>
#include <sys/socket.h>

#include <array>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "rdmacc/log.hpp"
#include "rdmacc/store.hpp"
#include "src/store/auth.hpp"
#include "src/store/protocol.hpp"
#include "src/store/socket.hpp"

namespace {

using namespace std::chrono_literals;
using namespace rdmacc;
namespace sp = store_protocol;

constexpr char kKey[] = "fuzz-key";
constexpr size_t kConnections = 4;

struct Servers {
  TCPStoreServer open{"127.0.0.1", 0};
  TCPStoreServer keyed{"127.0.0.1", 0, kKey};
  std::unique_ptr<TCPStore> openClient, keyedClient;
  uint64_t round = 0;
  std::string prefix;  // unguessable by the scripts, so they cannot pre-set our keys
  Servers() {
    const auth::Nonce n = auth::nonce();
    prefix = "legit/";
    for (int k = 0; k < 8; ++k) prefix += static_cast<char>('a' + n[static_cast<size_t>(k)] % 26);
    prefix += "/";
    setLogLevel(LogLevel::Off);  // the server's warnings about every bad client
    openClient =
        std::make_unique<TCPStore>("127.0.0.1", open.port(), TCPStoreOptions{.timeout = 5s});
    keyedClient = std::make_unique<TCPStore>("127.0.0.1", keyed.port(),
                                             TCPStoreOptions{.timeout = 5s, .authKey = kKey});
  }
};

Servers& servers() {
  static Servers* s = new Servers();  // never destroyed: threads outlive main's statics
  return *s;
}

net::Fd connectTo(uint16_t port) {
  int errnum = 0;
  std::string detail;
  return net::tryConnectTcp("127.0.0.1", port, net::Clock::now() + 2s, errnum, detail);
}

// Drains whatever the server sent (never blocks).
void drain(int fd) {
  uint8_t buf[65536];
  while (::recv(fd, buf, sizeof buf, MSG_DONTWAIT) > 0) {
  }
}

// A proper handshake, so that what follows reaches the request parser.
bool authenticate(int fd) {
  const auth::Nonce mine = auth::nonce();
  auto hello = sp::encode(sp::AuthFrame{.tag = sp::AuthTag::Hello,
                                        .body = std::vector<uint8_t>(mine.begin(), mine.end())});
  const auto deadline = net::Clock::now() + 2s;
  try {
    if (!net::sendAll(fd, hello.data(), hello.size(), deadline)) return false;
    std::vector<uint8_t> reply(4 + 1 + auth::kNonceBytes + auth::kMacBytes);
    if (!net::recvAll(fd, reply.data(), reply.size(), deadline)) return false;
    sp::AuthFrame challenge;
    if (sp::decode(reply.data(), reply.size(), challenge).state != sp::Decode::Ok) return false;
    auth::Nonce theirs{};
    std::memcpy(theirs.data(), challenge.body.data(), theirs.size());
    const auth::Mac proof = auth::mac(kKey, "rdmacc store client", theirs, mine);
    auto frame = sp::encode(sp::AuthFrame{
        .tag = sp::AuthTag::Proof, .body = std::vector<uint8_t>(proof.begin(), proof.end())});
    return net::sendAll(fd, frame.data(), frame.size(), deadline);
  } catch (const std::exception&) {
    return false;  // the server may drop a connection the script abused
  }
}

void check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "store server fuzz: %s\n", what);
    std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Servers& s = servers();
  std::array<net::Fd, kConnections> fds;
  size_t i = 0;
  auto byte = [&]() -> uint8_t { return i < size ? data[i++] : 0; };
  const bool keyed = (byte() & 1) != 0;
  const uint16_t port = keyed ? s.keyed.port() : s.open.port();
  while (i < size) {
    const uint8_t op = byte();
    net::Fd& fd = fds[op % kConnections];
    if (!fd) {
      fd = connectTo(port);
      if (!fd) continue;
      net::setNonBlocking(fd.get());
    }
    switch ((op >> 2) % 4) {
      case 0:
      case 1: {  // send the next n bytes as they are
        const size_t n = std::min<size_t>(byte() + 1, size - std::min(size, i));
        ssize_t sent = ::send(fd.get(), data + i, n, MSG_NOSIGNAL | MSG_DONTWAIT);
        (void)sent;
        i += n;
        break;
      }
      case 2:  // half-close or close
        if ((op & 0x40) != 0) {
          ::shutdown(fd.get(), SHUT_WR);
        } else {
          fd.reset();
        }
        break;
      case 3:  // authenticate (only meaningful on the keyed server)
        if (keyed) authenticate(fd.get());
        break;
    }
    if (fd) drain(fd.get());
  }
  for (auto& fd : fds) fd.reset();
  // Both servers still serve a legitimate client correctly.
  const std::string key = s.prefix + std::to_string(s.round++);
  for (TCPStore* client : {s.openClient.get(), s.keyedClient.get()}) {
    client->set(key, Bytes{1, 2, 3});
    check(client->get(key) == Bytes({1, 2, 3}), "a legitimate get returned the wrong value");
    check(client->add(key + "/n", 5) == 5, "a legitimate add returned the wrong count");
    check(client->deleteKey(key), "a legitimate delete found nothing");
  }
  return 0;
}
