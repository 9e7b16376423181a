#include <gtest/gtest.h>

#include "rdmacc/config.hpp"
#include "rdmacc/error.hpp"

namespace rdmacc {
namespace {

TEST(Config, DefaultsComeFromTheTable) {
  Config c = Config::load({}, {});
  EXPECT_EQ(c.getInt("RDMACC_IB_GID_INDEX"), -1);
  EXPECT_EQ(c.getInt("RDMACC_QPS_PER_PEER"), 1);
  EXPECT_EQ(c.getDuration("RDMACC_CONNECT_TIMEOUT"), std::chrono::seconds(60));
  EXPECT_EQ(c.getDuration("RDMACC_TIMEOUT"), std::chrono::minutes(30));
  EXPECT_FALSE(c.getBool("RDMACC_AGENT_STORE"));
  EXPECT_EQ(c.source("RDMACC_IB_TIMEOUT"), ValueSource::Default);
  EXPECT_TRUE(c.warnings().empty());
}

TEST(Config, ExplicitBeatsEnvironmentBeatsDefault) {
  Config c = Config::load({{"RDMACC_IB_TIMEOUT", "20"}},
                          {"RDMACC_IB_TIMEOUT=18", "RDMACC_IB_RETRY_CNT=3", "PATH=/bin"});
  EXPECT_EQ(c.getInt("RDMACC_IB_TIMEOUT"), 20);
  EXPECT_EQ(c.source("RDMACC_IB_TIMEOUT"), ValueSource::Explicit);
  EXPECT_EQ(c.getInt("RDMACC_IB_RETRY_CNT"), 3);
  EXPECT_EQ(c.source("RDMACC_IB_RETRY_CNT"), ValueSource::Environment);
  EXPECT_EQ(c.getInt("RDMACC_IB_RNR_RETRY"), 7);
}

TEST(Config, UnknownVariableWarnsWithSuggestion) {
  Config c = Config::load(
      {}, {"RDMACC_IB_GID_INDX=3", "RDMACC_TEST_ANYTHING=1", "RDMACC_ZZZZZZZZZZZZZZ=1"});
  ASSERT_EQ(c.warnings().size(), 2u);
  EXPECT_NE(c.warnings()[0].find("did you mean RDMACC_IB_GID_INDEX"), std::string::npos)
      << c.warnings()[0];
  EXPECT_NE(c.warnings()[1].find("RDMACC_ZZZZZZZZZZZZZZ"), std::string::npos);
  EXPECT_EQ(c.getInt("RDMACC_IB_GID_INDEX"), -1);
}

TEST(Config, TheProjectsOwnVariablesAreNotWarnedAbout) {
  Config c =
      Config::load({}, {"RDMACC_BUILD_DIR=/tmp/b", "RDMACC_FORCE_VM=1", "RDMACC_VM_SHARES=/a:/b",
                        "RDMACC_QUICK=1", "RDMACC_TORCH2=0", "RDMACC_FUZZ_SECONDS=5"});
  EXPECT_TRUE(c.warnings().empty()) << c.warnings().front();
}

TEST(Config, NcclsSpellingOfTheLogLevelGetsAHint) {
  Config c = Config::load({}, {"RDMACC_DEBUG=INFO"});
  ASSERT_EQ(c.warnings().size(), 1u);
  EXPECT_NE(c.warnings()[0].find("did you mean RDMACC_LOG_LEVEL"), std::string::npos)
      << c.warnings()[0];
}

TEST(Config, TheTransportIsAutoRdmaOrShm) {
  EXPECT_EQ(Config::load({}, {}).getString("RDMACC_TRANSPORT"), "auto");
  EXPECT_EQ(Config::load({}, {"RDMACC_TRANSPORT=shm"}).getString("RDMACC_TRANSPORT"), "shm");
  EXPECT_THROW(Config::load({}, {"RDMACC_TRANSPORT=tcp"}), Error);
}

TEST(Config, BadValuesNameTheVariableAndTheFix) {
  auto expectError = [](std::vector<std::string> env, const std::string& fragment) {
    try {
      Config::load({}, env);
      ADD_FAILURE() << "no error for " << env[0];
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::InvalidArgument);
      EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
    }
  };
  expectError({"RDMACC_IB_TIMEOUT=abc"}, "RDMACC_IB_TIMEOUT='abc' is not an integer");
  expectError({"RDMACC_IB_RETRY_CNT=8"}, "[0, 7]");
  expectError({"RDMACC_IB_MTU=1500"}, "256, 512, 1024, 2048 or 4096");
  expectError({"RDMACC_CONNECT_TIMEOUT=10 parsecs"}, "30s");
  expectError({"RDMACC_AGENT_STORE=maybe"}, "not a boolean");
  expectError({"RDMACC_LOG_LEVEL=loud"}, "unknown log level");
  expectError({"RDMACC_SPIN_YIELD=yes"}, "set RDMACC_SPIN_YIELD to one of auto, 0, 1");
  expectError({"RDMACC_CONNECT=later"}, "RDMACC_CONNECT='later' is not one of auto, lazy, eager");
  expectError({"RDMACC_SPIN_US=fast"}, "RDMACC_SPIN_US='fast' is not an integer");
  expectError({"RDMACC_SPIN_US=-5"}, "auto (the default) or 0 to 10000000 microseconds");
  EXPECT_NO_THROW(Config::load({}, {"RDMACC_SPIN_US=200"}));
  EXPECT_NO_THROW(Config::load({}, {"RDMACC_SPIN_US=auto"}));
  EXPECT_THROW(Config::load({{"RDMACC_NOPE", "1"}}, {}), Error);
}

TEST(Config, DurationsAndBooleans) {
  EXPECT_EQ(parseDuration("250ms", "x"), std::chrono::milliseconds(250));
  EXPECT_EQ(parseDuration("0", "x"), std::chrono::milliseconds(0));
  // A bare number is refused with the fix (it meant milliseconds here and
  // seconds on the tools' command lines).
  try {
    parseDuration("1800", "RDMACC_TIMEOUT");
    FAIL() << "a bare 1800 was taken";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("RDMACC_TIMEOUT=1800s for seconds"), std::string::npos)
        << e.what();
  }
  EXPECT_EQ(parseDuration("2m", "x"), std::chrono::minutes(2));
  EXPECT_EQ(parseDuration("1h", "x"), std::chrono::hours(1));
  EXPECT_THROW(parseDuration("-1s", "x"), Error);
  EXPECT_THROW(parseDuration("s", "x"), Error);
  EXPECT_TRUE(parseBool("Yes", "x"));
  EXPECT_FALSE(parseBool("off", "x"));
}

TEST(Config, EveryOptionHasDocAndValidDefault) {
  for (const auto& spec : optionTable()) {
    EXPECT_TRUE(spec.name.starts_with("RDMACC_")) << spec.name;
    EXPECT_FALSE(spec.doc.empty()) << spec.name;
    EXPECT_EQ(findOption(spec.name), &spec);
  }
  EXPECT_NO_THROW(Config::load({}, {}));
}

}  // namespace
}  // namespace rdmacc
