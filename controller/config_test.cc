#include "controller/config.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <utility>
#include <vector>

#include "common/yaml_document.h"

namespace llmctl::controller {
namespace {

using std::chrono::milliseconds;

TEST(ParseDurationTest, ReadsEachUnit) {
  EXPECT_EQ(*ParseDuration("500ms"), milliseconds(500));
  EXPECT_EQ(*ParseDuration("30s"), milliseconds(30'000));
  EXPECT_EQ(*ParseDuration("10m"), milliseconds(600'000));
  EXPECT_EQ(*ParseDuration("2h"), milliseconds(7'200'000));
}

TEST(ParseDurationTest, RefusesWhatIsNoDuration) {
  for (const char* text : {"", "10", "0s", "-5s", "5 s", "5d", "s", "99999999999999999h"}) {
    auto duration = ParseDuration(text);
    ASSERT_FALSE(duration.ok()) << text;
    EXPECT_NE(duration.status().message().find("expected a duration"), std::string::npos);
  }
}

// The daemon adds each duration to the clocks' now in nanoseconds: 2562047h (9.2e18 ns) or
// 9223372036854775807ms passed ParseDuration and overflowed there (found by
// tests/fuzz/controller_config_fuzz.cc).
TEST(ParseDurationTest, RefusesMoreThanAYear) {
  EXPECT_EQ(*ParseDuration("8760h"), kMaxDuration);
  EXPECT_EQ(*ParseDuration("31536000000ms"), kMaxDuration);
  for (const char* text :
       {"8761h", "525601m", "31536000001ms", "2562047h", "9223372036854775807ms"}) {
    auto duration = ParseDuration(text);
    ASSERT_FALSE(duration.ok()) << text;
    EXPECT_EQ(duration.status().code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(duration.status().message(),
              "expected a duration of at most 8760h (a year), got '" + std::string(text) + "'");
  }
  ControllerConfig config;
  EXPECT_EQ(ApplyConfigYaml("requeue_after: 2562047h\n", "c.yaml", config).message(),
            "c.yaml:1:16: requeue_after: expected a duration of at most 8760h (a year), got "
            "'2562047h'");
  EXPECT_EQ(config.requeue_after, std::chrono::minutes(10));
}

TEST(ListenAddressTest, LoopbackAndUnixSocketsAreAllowed) {
  for (const char* address :
       {"unix:/tmp/x/controller.sock", "127.0.0.1:7070", "localhost:0", "[::1]:65535"}) {
    EXPECT_TRUE(ValidateListenAddress(address, false).ok()) << address;
  }
}

TEST(ListenAddressTest, OtherAddressesNeedTheFlag) {
  Status refused = ValidateListenAddress("0.0.0.0:7070", false);
  EXPECT_EQ(refused.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(refused.message().find("--allow-remote-listen"), std::string::npos);
  EXPECT_TRUE(ValidateListenAddress("0.0.0.0:7070", true).ok());
}

TEST(ListenAddressTest, RefusesMalformedAddresses) {
  for (const char* address :
       {"unix:relative.sock", "unix:", "7070", "127.0.0.1:", "host:70000", "127.0.0.1:x",
        // from_chars reads a sign: "-0" was port 0 (found by controller_config_fuzz.cc).
        "127.0.0.1:-0", "127.0.0.1:+1", "127.0.0.1: 1"}) {
    EXPECT_EQ(ValidateListenAddress(address, true).code(), StatusCode::kInvalidArgument) << address;
  }
}

TEST(ConfigYamlTest, SetsEveryKey) {
  ControllerConfig config;
  ASSERT_TRUE(ApplyConfigYaml("data_dir: /srv/llmctl\nlisten: 127.0.0.1:9000\n"
                              "allow_remote_listen: true\nrequeue_after: 2m\n"
                              "agent_call_deadline: 5s\nhealth_interval: 250ms\n"
                              "min_transfer_rate: 2MiB\ntoken_file: /etc/llmctl/api.token\n",
                              "c.yaml", config)
                  .ok());
  EXPECT_EQ(config.data_dir, "/srv/llmctl");
  EXPECT_EQ(config.listen, "127.0.0.1:9000");
  EXPECT_TRUE(config.allow_remote_listen);
  EXPECT_EQ(config.requeue_after, milliseconds(120'000));
  EXPECT_EQ(config.agent_call_deadline, milliseconds(5'000));
  EXPECT_EQ(config.health_interval, milliseconds(250));
  EXPECT_EQ(config.min_transfer_bytes_per_second, 2 << 20);
  EXPECT_EQ(config.token_file, "/etc/llmctl/api.token");
}

TEST(ConfigYamlTest, MinTransferRateMustBeAPositiveSize) {
  ControllerConfig config;
  EXPECT_EQ(config.min_transfer_bytes_per_second, rpc::kDefaultMinTransferBytesPerSecond);
  for (const char* bad : {"min_transfer_rate: 0\n", "min_transfer_rate: fast\n"}) {
    Status status = ApplyConfigYaml(bad, "c.yaml", config);
    EXPECT_NE(status.message().find("c.yaml:1:20: min_transfer_rate: "), std::string::npos)
        << status.message();
  }
}

TEST(ConfigYamlTest, ErrorsNameTheFileLineAndKey) {
  ControllerConfig config;
  Status unknown = ApplyConfigYaml("listen: unix:/a.sock\nrequeue: 5m\n", "c.yaml", config);
  EXPECT_EQ(unknown.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(unknown.message().find("c.yaml:2:1: unknown setting 'requeue'"), std::string::npos)
      << unknown.message();

  Status bad_duration = ApplyConfigYaml("requeue_after: soon\n", "c.yaml", config);
  EXPECT_NE(bad_duration.message().find("c.yaml:1:16: requeue_after: expected a duration"),
            std::string::npos)
      << bad_duration.message();

  EXPECT_NE(ApplyConfigYaml("[1, 2]", "c.yaml", config).message().find("expected a map"),
            std::string::npos);
  EXPECT_NE(ApplyConfigYaml("a: [", "c.yaml", config).message().find("c.yaml:1:"),
            std::string::npos);
  // A name that is no name is refused where it is, as yaml-cpp's conversion would have thrown.
  EXPECT_EQ(
      ApplyConfigYaml("listen: unix:/a.sock\n? [data_dir]\n: /srv\n", "c.yaml", config).message(),
      "c.yaml:2:3: a setting's name is a list or a map, not a name");
}

// yaml-cpp said "bad file" for nesting 500 deep, and nothing counted the values it built nodes for
// (about 500 bytes each).
TEST(ResolveConfigTest, AFileTooDeepOfTooManyValuesOrTooLargeIsRefusedNamingIt) {
  const std::string file = testing::TempDir() + "/controller_config_test_refused.yaml";
  std::string many_values = "listen: [0";
  for (int i = 0; i < 100'000; ++i) many_values += ",1";
  for (const auto& [text, reason] : std::vector<std::pair<std::string, std::string>>{
           {"listen: " + std::string(600, '[') + std::string(600, ']') + "\n",
            ": lists and maps nested 500 levels deep, more than the YAML reader takes"},
           {many_values + "]\n", ": more than 100000 values (scalars, lists and maps) in one file"},
           {std::string(kMaxYamlSettingsBytes + 1, '#'), " is larger than 1048576 bytes"}}) {
    std::ofstream(file, std::ios::trunc) << text;
    const Status status = ResolveControllerConfig({.config_file = file}).status();
    EXPECT_EQ(status.message().rfind(file, 0), 0u) << status.message();
    EXPECT_NE(status.message().find(reason), std::string::npos) << status.message();
  }
  std::remove(file.c_str());
}

TEST(ResolveConfigTest, DefaultsFollowTheDataDirectory) {
  auto config = ResolveControllerConfig({.env_home = "/home/u"});
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  EXPECT_EQ(config->data_dir, "/home/u/.local/share/llmctl");
  EXPECT_EQ(config->listen, "unix:/home/u/.local/share/llmctl/controller.sock");

  auto xdg = ResolveControllerConfig({.env_home = "/home/u", .env_xdg_data_home = "/x"});
  EXPECT_EQ(xdg->data_dir, "/x/llmctl");
}

TEST(ResolveConfigTest, FlagsOverrideTheEnvironmentWhichOverridesTheFile) {
  const std::string file = testing::TempDir() + "/controller_config_test.yaml";
  FILE* out = fopen(file.c_str(), "w");
  fputs("data_dir: /from/file\nlisten: 127.0.0.1:1\ntoken_file: /from/file.token\n", out);
  fclose(out);

  auto from_file = ResolveControllerConfig({.config_file = file});
  EXPECT_EQ(from_file->listen, "127.0.0.1:1");
  auto from_env = ResolveControllerConfig({.config_file = file, .env_controller = "127.0.0.1:2"});
  EXPECT_EQ(from_env->listen, "127.0.0.1:2");
  EXPECT_EQ(from_env->data_dir, "/from/file");
  auto from_flags = ResolveControllerConfig({.config_file = file,
                                             .data_dir = "/from/flag",
                                             .listen = "127.0.0.1:3",
                                             .env_controller = "127.0.0.1:2"});
  EXPECT_EQ(from_flags->listen, "127.0.0.1:3");
  EXPECT_EQ(from_flags->data_dir, "/from/flag");
  EXPECT_EQ(from_flags->token_file, "/from/file.token");
  auto token_from_env =
      ResolveControllerConfig({.config_file = file, .env_token_file = "/from/env.token"});
  EXPECT_EQ(token_from_env->token_file, "/from/env.token");
  auto token_from_flag = ResolveControllerConfig(
      {.config_file = file, .token_file = "/from/flag.token", .env_token_file = "/from/env.token"});
  EXPECT_EQ(token_from_flag->token_file, "/from/flag.token");
}

TEST(ResolveConfigTest, ATcpListenAddressNeedsATokenFile) {
  Status refused = ResolveControllerConfig({.data_dir = "/d", .listen = "127.0.0.1:7070"}).status();
  EXPECT_EQ(refused.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(refused.message().rfind("listen address '127.0.0.1:7070' is TCP, which any local "
                                    "account can reach: set token_file (--token-file, "
                                    "LLMCTL_CONTROLLER_TOKEN_FILE)",
                                    0),
            0u)
      << refused.message();
  EXPECT_TRUE(ResolveControllerConfig(
                  {.data_dir = "/d", .listen = "127.0.0.1:7070", .token_file = "/d/api.token"})
                  .ok());
  EXPECT_TRUE(ResolveControllerConfig({.data_dir = "/d", .listen = "unix:/d/c.sock"}).ok());
  EXPECT_EQ(ResolveControllerConfig(
                {.data_dir = "/d", .listen = "127.0.0.1:7070", .token_file = "api.token"})
                .status()
                .message(),
            "token file 'api.token' must be an absolute path");
}

TEST(ResolveConfigTest, RefusesRelativeDirectoriesAndRemoteListening) {
  EXPECT_EQ(ResolveControllerConfig({.data_dir = "rel"}).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(ResolveControllerConfig({.data_dir = "/d", .listen = "10.0.0.5:7070"}).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_TRUE(ResolveControllerConfig({.data_dir = "/d",
                                       .listen = "10.0.0.5:7070",
                                       .token_file = "/d/api.token",
                                       .allow_remote_listen = true})
                  .ok());
  EXPECT_EQ(ResolveControllerConfig({.config_file = "/no/such/file.yaml"}).status().code(),
            StatusCode::kNotFound);
}

}  // namespace
}  // namespace llmctl::controller
