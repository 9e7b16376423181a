#include <gtest/gtest.h>

#include "rdmacc/error.hpp"
#include "rdmacc/topology.hpp"

namespace rdmacc {
namespace {

GidEntry gid(int index, std::array<uint8_t, 16> raw, const std::string& type) {
  GidEntry g;
  g.index = index;
  g.raw = raw;
  g.address = formatGid(raw);
  g.type = type;
  g.netdev = "eth0";
  return g;
}

std::array<uint8_t, 16> v4(uint8_t a, uint8_t b, uint8_t c, uint8_t d) {
  return {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, a, b, c, d};
}

std::array<uint8_t, 16> linkLocal() {
  return {0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0xff, 0, 0xff, 0xfe, 0, 0x77, 1};
}

// A mlx5-like RoCE table: v1 and v2 for link-local, then v1 and v2 for two IPv4 addresses.
PortInfo roceTable() {
  PortInfo p;
  p.port = 1;
  p.active = true;
  p.linkLayer = "Ethernet";
  p.gids = {gid(0, linkLocal(), "IB/RoCE v1"),     gid(1, linkLocal(), "RoCE v2"),
            gid(2, v4(10, 0, 0, 1), "IB/RoCE v1"), gid(3, v4(10, 0, 0, 1), "RoCE v2"),
            gid(4, v4(10, 0, 1, 1), "IB/RoCE v1"), gid(5, v4(10, 0, 1, 1), "RoCE v2")};
  return p;
}

uint32_t ip(uint8_t a, uint8_t b, uint8_t c, uint8_t d) {
  return static_cast<uint32_t>(a) << 24 | static_cast<uint32_t>(b) << 16 |
         static_cast<uint32_t>(c) << 8 | d;
}

TEST(Gid, AutoPicksRoceV2Ipv4MatchingTheBoundAddress) {
  EXPECT_EQ(chooseGid("mlx5_0", roceTable(), -1, ip(10, 0, 1, 1)).index, 5);
  EXPECT_EQ(chooseGid("mlx5_0", roceTable(), -1, ip(10, 0, 0, 1)).index, 3);
}

TEST(Gid, AutoWithoutAddressPicksFirstRoceV2Ipv4) {
  auto c = chooseGid("mlx5_0", roceTable(), -1, std::nullopt);
  EXPECT_EQ(c.index, 3);
  EXPECT_NE(c.reason.find("RoCE v2"), std::string::npos);
}

TEST(Gid, RxeTableLikeTheVm) {
  PortInfo p;
  p.linkLayer = "Ethernet";
  p.gids = {gid(0, linkLocal(), "RoCE v2"), gid(1, v4(192, 168, 77, 1), "RoCE v2")};
  EXPECT_EQ(chooseGid("rxe0", p, -1, std::nullopt).index, 1);
  EXPECT_EQ(chooseGid("rxe0", p, -1, ip(192, 168, 77, 1)).index, 1);
}

TEST(Gid, ExplicitIndexMustExistAndBeRoceV2) {
  EXPECT_EQ(chooseGid("mlx5_0", roceTable(), 5, std::nullopt).index, 5);
  try {
    chooseGid("mlx5_0", roceTable(), 2, std::nullopt);
    FAIL();
  } catch (const Error& e) {
    std::string w = e.what();
    EXPECT_NE(w.find("mlx5_0 port 1"), std::string::npos) << w;
    EXPECT_NE(w.find("not RoCE v2"), std::string::npos) << w;
    EXPECT_NE(w.find("3: ::ffff:10.0.0.1 (RoCE v2, eth0)"), std::string::npos) << w;
  }
  try {
    chooseGid("mlx5_0", roceTable(), 9, std::nullopt);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("RDMACC_IB_GID_INDEX=9 does not exist on mlx5_0 port 1"),
              std::string::npos)
        << e.what();
  }
}

TEST(Gid, AddressNotOnPortIsAnErrorListingGids) {
  try {
    chooseGid("mlx5_0", roceTable(), -1, ip(172, 16, 0, 1));
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::NoDevice);
    EXPECT_NE(std::string(e.what()).find("no RoCE v2 GID for address 172.16.0.1"),
              std::string::npos)
        << e.what();
  }
}

TEST(Gid, NoIpv4GidTellsHowToAddOne) {
  PortInfo p;
  p.linkLayer = "Ethernet";
  p.gids = {gid(0, linkLocal(), "RoCE v2")};
  try {
    chooseGid("rxe0", p, -1, std::nullopt);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("ip addr add"), std::string::npos) << e.what();
  }
}

TEST(Gid, InfiniBandUsesPortGid) {
  PortInfo p;
  p.linkLayer = "InfiniBand";
  p.gids = {gid(0, linkLocal(), "IB")};
  EXPECT_EQ(chooseGid("mlx5_1", p, -1, ip(10, 1, 1, 1)).index, 0);
}

TEST(Gid, Ipv4MappingAndFormatting) {
  auto g = gid(0, v4(192, 168, 77, 1), "RoCE v2");
  ASSERT_TRUE(g.ipv4());
  EXPECT_EQ(formatIpv4(*g.ipv4()), "192.168.77.1");
  EXPECT_EQ(g.address, "::ffff:192.168.77.1");
  EXPECT_FALSE(gid(0, linkLocal(), "RoCE v2").ipv4());
}

}  // namespace
}  // namespace rdmacc

namespace rdmacc {
namespace {

// On a machine without RDMA (like the CI hosts) the error must say how to get a device.
TEST(NoDevice, ErrorSaysHowToGetOne) {
  if (!listDevices().empty()) GTEST_SKIP() << "this machine has an RDMA device";
  try {
    selectEndpoint(Config::load({}, {}));
    FAIL() << "an endpoint without a device";
  } catch (const Error& e) {
    std::string w = e.what();
    EXPECT_EQ(e.kind(), ErrorKind::NoDevice);
    EXPECT_NE(w.find("no RDMA device found"), std::string::npos) << w;
    EXPECT_NE(w.find("modprobe rdma_rxe && rdma link add rxe0 type rxe netdev eth0"),
              std::string::npos)
        << w;
    EXPECT_NE(w.find("tools/with-rdma-device"), std::string::npos) << w;
  }
}

}  // namespace
}  // namespace rdmacc

namespace rdmacc {
namespace {

TEST(HcaList, ParsesDevicesAndPorts) {
  EXPECT_TRUE(parseHcaList("").empty());
  auto one = parseHcaList("rxe0");
  ASSERT_EQ(one.size(), 1u);
  EXPECT_EQ(one[0].device, "rxe0");
  EXPECT_EQ(one[0].port, 0);
  auto two = parseHcaList("mlx5_0:1,mlx5_1:2");
  ASSERT_EQ(two.size(), 2u);
  EXPECT_EQ(two[1].device, "mlx5_1");
  EXPECT_EQ(two[1].port, 2);
}

TEST(HcaList, RejectsMalformedEntriesNamingThem) {
  auto expectError = [](const std::string& text, const std::string& fragment) {
    try {
      parseHcaList(text);
      ADD_FAILURE() << "no error for '" << text << "'";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::InvalidArgument);
      EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
    }
  };
  expectError("rxe0,", "empty entry");
  expectError(",rxe0", "empty entry");
  expectError("rxe0:x", "bad port in 'rxe0:x'");
  expectError("rxe0:0", "bad port");
  expectError("rxe0:99999999999", "bad port");
  expectError("rxe0:", "bad port");
  expectError(":1", "without a device");
}

}  // namespace
}  // namespace rdmacc
