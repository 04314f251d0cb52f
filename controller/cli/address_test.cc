#include "controller/cli/address.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>
#include <map>
#include <utility>
#include <vector>

#include "common/home_directory.h"
#include "common/yaml_document.h"

namespace llmctl::cli {
namespace {

namespace fs = std::filesystem;

EnvLookup FakeEnv(std::map<std::string, std::string> values) {
  return [values = std::move(values)](std::string_view name) -> std::optional<std::string> {
    auto it = values.find(std::string(name));
    if (it == values.end()) return std::nullopt;
    return it->second;
  };
}

class AddressTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char pattern[] = "/tmp/llmctl-address-XXXXXX";
    ASSERT_NE(::mkdtemp(pattern), nullptr);
    home_ = pattern;
  }
  void TearDown() override { fs::remove_all(home_); }
  void WriteConfig(const std::string& text) {
    fs::create_directories(home_ / ".config" / "llmctl");
    std::ofstream(home_ / ".config" / "llmctl" / "config.yaml") << text;
  }
  fs::path home_;
};

TEST(CheckControllerTargetTest, AcceptsUnixPathsAndHostPorts) {
  for (const char* good : {"unix:/run/llmctl/controller.sock", "localhost:7070", "127.0.0.1:1",
                           "[::1]:65535", "controller.example:443"}) {
    EXPECT_TRUE(CheckControllerTarget(good, "test").ok()) << good;
  }
  for (const char* bad : {"unix:relative.sock", "localhost", "localhost:0", "host:65536", ":7070",
                          "::1:7070", "host:port", "unix:"}) {
    Status status = CheckControllerTarget(bad, "LLMCTL_CONTROLLER");
    EXPECT_EQ(status.code(), StatusCode::kInvalidArgument) << bad;
    EXPECT_EQ(status.message().rfind("LLMCTL_CONTROLLER: controller address '", 0), 0u)
        << status.message();
  }
}

TEST_F(AddressTest, EnvironmentWinsOverTheConfigFile) {
  WriteConfig("controller: localhost:7070\n");
  StatusOr<ControllerAddress> address = ResolveControllerAddress(
      FakeEnv({{"HOME", home_.string()}, {"LLMCTL_CONTROLLER", "unix:/tmp/c.sock"}}));
  ASSERT_TRUE(address.ok()) << address.status().message();
  EXPECT_EQ(address->target, "unix:/tmp/c.sock");
  EXPECT_EQ(address->source, "LLMCTL_CONTROLLER");
  EXPECT_FALSE(address->embedded);
}

TEST_F(AddressTest, ConfigFileWhenNoEnvironment) {
  WriteConfig("# where llmctld listens\ncontroller: localhost:7070\n");
  StatusOr<ControllerAddress> address = ResolveControllerAddress(FakeEnv({{"HOME", home_}}));
  ASSERT_TRUE(address.ok()) << address.status().message();
  EXPECT_EQ(address->target, "localhost:7070");
  EXPECT_EQ(address->source, (home_ / ".config/llmctl/config.yaml").string());
  EXPECT_FALSE(address->embedded);
}

TEST_F(AddressTest, XdgConfigHomeMovesTheConfigFile) {
  fs::create_directories(home_ / "xdg" / "llmctl");
  std::ofstream(home_ / "xdg" / "llmctl" / "config.yaml") << "controller: unix:/x.sock\n";
  StatusOr<ControllerAddress> address = ResolveControllerAddress(
      FakeEnv({{"HOME", home_}, {"XDG_CONFIG_HOME", (home_ / "xdg").string()}}));
  ASSERT_TRUE(address.ok()) << address.status().message();
  EXPECT_EQ(address->target, "unix:/x.sock");
}

TEST_F(AddressTest, ConfigFileErrorsNameFileLineAndColumn) {
  const std::string file = (home_ / ".config/llmctl/config.yaml").string();
  WriteConfig("controler: localhost:7070\n");
  Status unknown = ResolveControllerAddress(FakeEnv({{"HOME", home_}})).status();
  EXPECT_EQ(unknown.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(unknown.message(),
            file + ":1:1: unknown key 'controler' (the keys are 'controller' and 'token_file')");

  WriteConfig("\ncontroller: localhost\n");
  Status bad = ResolveControllerAddress(FakeEnv({{"HOME", home_}})).status();
  EXPECT_EQ(bad.message().rfind(file + ":2:13: controller address 'localhost'", 0), 0u)
      << bad.message();

  WriteConfig("controller: [unclosed\n");
  Status syntax = ResolveControllerAddress(FakeEnv({{"HOME", home_}})).status();
  EXPECT_EQ(syntax.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(syntax.message().rfind(file + ":", 0), 0u) << syntax.message();
}

// yaml-cpp said "bad file" for nesting 500 deep, and nothing counted the values it built nodes for
// (about 500 bytes each).
TEST_F(AddressTest, AConfigFileTooDeepOfTooManyValuesOrTooLargeIsRefusedNamingIt) {
  const std::string file = (home_ / ".config/llmctl/config.yaml").string();
  std::string many_values = "controller: [0";
  for (int i = 0; i < 100'000; ++i) many_values += ",1";
  for (const auto& [text, reason] : std::vector<std::pair<std::string, std::string>>{
           {"controller: " + std::string(600, '[') + std::string(600, ']') + "\n",
            ": lists and maps nested 500 levels deep, more than the YAML reader takes"},
           {many_values + "]\n", ": more than 100000 values (scalars, lists and maps) in one file"},
           {std::string(kMaxYamlSettingsBytes + 1, '#'), " is larger than 1048576 bytes"}}) {
    WriteConfig(text);
    const Status status = ResolveControllerAddress(FakeEnv({{"HOME", home_}})).status();
    EXPECT_EQ(status.message().rfind(file, 0), 0u) << status.message();
    EXPECT_NE(status.message().find(reason), std::string::npos) << status.message();
  }
}

TEST_F(AddressTest, TokenFileFromTheEnvironmentElseTheConfigFile) {
  WriteConfig("controller: localhost:7070\ntoken_file: /etc/llmctl/token\n");
  StatusOr<ControllerAddress> address = ResolveControllerAddress(FakeEnv({{"HOME", home_}}));
  ASSERT_TRUE(address.ok()) << address.status().message();
  EXPECT_EQ(address->token_file, "/etc/llmctl/token");

  address = ResolveControllerAddress(FakeEnv({{"HOME", home_},
                                              {"LLMCTL_CONTROLLER", "127.0.0.1:7071"},
                                              {"LLMCTL_CONTROLLER_TOKEN_FILE", "/run/token"}}));
  ASSERT_TRUE(address.ok()) << address.status().message();
  EXPECT_EQ(address->target, "127.0.0.1:7071");
  EXPECT_EQ(address->token_file, "/run/token");

  Status relative = ResolveControllerAddress(
                        FakeEnv({{"HOME", home_}, {"LLMCTL_CONTROLLER_TOKEN_FILE", "token"}}))
                        .status();
  EXPECT_EQ(relative.message(), "LLMCTL_CONTROLLER_TOKEN_FILE='token' is not an absolute path");
  WriteConfig("token_file: token\n");
  EXPECT_EQ(ResolveControllerAddress(FakeEnv({{"HOME", home_}})).status().message(),
            (home_ / ".config/llmctl/config.yaml").string() +
                ":1:13: token_file: expected the absolute path of a 0600 file");
}

TEST_F(AddressTest, AConfigFileThatCannotMatterIsNotRead) {
  WriteConfig("controler: [unclosed\n");
  StatusOr<ControllerAddress> unix_socket = ResolveControllerAddress(
      FakeEnv({{"HOME", home_.string()}, {"LLMCTL_CONTROLLER", "unix:/tmp/c.sock"}}));
  ASSERT_TRUE(unix_socket.ok()) << unix_socket.status().message();
  EXPECT_EQ(unix_socket->target, "unix:/tmp/c.sock");
  StatusOr<ControllerAddress> with_token =
      ResolveControllerAddress(FakeEnv({{"HOME", home_.string()},
                                        {"LLMCTL_CONTROLLER", "127.0.0.1:7070"},
                                        {"LLMCTL_CONTROLLER_TOKEN_FILE", "/run/token"}}));
  ASSERT_TRUE(with_token.ok()) << with_token.status().message();
  EXPECT_EQ(with_token->token_file, "/run/token");
  // A TCP controller without LLMCTL_CONTROLLER_TOKEN_FILE may take its token file from it.
  EXPECT_EQ(ResolveControllerAddress(
                FakeEnv({{"HOME", home_.string()}, {"LLMCTL_CONTROLLER", "127.0.0.1:7070"}}))
                .status()
                .code(),
            StatusCode::kInvalidArgument);
}

TEST_F(AddressTest, EmbeddedDefaultUsesTheDataDirectory) {
  StatusOr<ControllerAddress> address = ResolveControllerAddress(FakeEnv({{"HOME", home_}}));
  ASSERT_TRUE(address.ok()) << address.status().message();
  EXPECT_TRUE(address->embedded);
  EXPECT_EQ(address->data_dir, home_ / ".local/share/llmctl");
  EXPECT_EQ(address->target, "unix:" + (home_ / ".local/share/llmctl/controller.sock").string());

  WriteConfig("# nothing configured yet\n");
  EXPECT_TRUE(ResolveControllerAddress(FakeEnv({{"HOME", home_}}))->embedded);
}

// LLMCTL_HOME=/path/ (a shell's completion adds the slash) names the directory /path: made as that,
// 0700, where the CLI once made it with the umask's 0755 and llmctld then refused it for good as
// open to other users.
TEST(EmbeddedDataDirTest, ATrailingSlashNamesTheSameDirectory) {
  EXPECT_EQ(*EmbeddedDataDir(FakeEnv({{"LLMCTL_HOME", "/d/home/"}})), fs::path("/d/home"));
  EXPECT_EQ(*EmbeddedDataDir(FakeEnv({{"LLMCTL_HOME", "/d/home//"}})), fs::path("/d/home"));
  EXPECT_EQ(*EmbeddedDataDir(FakeEnv({{"LLMCTL_HOME", "/"}})), fs::path("/"));
}

// The XDG base directory spec: a relative path in XDG_DATA_HOME or XDG_CONFIG_HOME is invalid and
// ignored, where the data directory refused it (exit 2) and the config file was read relative to
// the directory llmctl ran in.
TEST(EmbeddedDataDirTest, RelativeXdgDirectoriesAreIgnored) {
  EXPECT_EQ(*EmbeddedDataDir(FakeEnv({{"XDG_DATA_HOME", "data"}, {"HOME", "/h"}})),
            fs::path("/h/.local/share/llmctl"));
  EXPECT_EQ(*ConfigFilePath(FakeEnv({{"XDG_CONFIG_HOME", "config"}, {"HOME", "/h"}})),
            fs::path("/h/.config/llmctl/config.yaml"));
  const StatusOr<fs::path> entry = PasswordDatabaseHome(::getuid());
  ASSERT_TRUE(entry.ok()) << entry.status().ToString();
  EXPECT_EQ(*ConfigFilePath(FakeEnv({{"XDG_CONFIG_HOME", "./config"}})),
            *entry / ".config/llmctl/config.yaml");
}

// The daemons' socket addresses are under the data directory and travel in proto3 strings, which
// must be UTF-8: a path that is not is refused at once, where llmctl probed this machine for a
// minute and a half, then failed registering the local agent with an empty message.
TEST(EmbeddedDataDirTest, ADirectoryWhosePathIsNotUtf8IsRefused) {
  for (const auto& [name, value] :
       std::map<std::string, std::string>{{"LLMCTL_HOME", "/d/caf\xe9"},
                                          {"XDG_DATA_HOME", "/x/caf\xe9"},
                                          {"HOME", "/h/caf\xe9"}}) {
    const Status refused = EmbeddedDataDir(FakeEnv({{name, value}})).status();
    EXPECT_EQ(refused.code(), StatusCode::kInvalidArgument) << name;
    EXPECT_NE(refused.message().find(name + "='" + value + "' is not UTF-8 text"),
              std::string::npos)
        << refused.message();
  }
}

TEST(EmbeddedDataDirTest, LlmctlHomeThenXdgDataHomeThenHome) {
  EXPECT_EQ(
      *EmbeddedDataDir(FakeEnv({{"LLMCTL_HOME", "/d"}, {"XDG_DATA_HOME", "/x"}, {"HOME", "/h"}})),
      fs::path("/d"));
  EXPECT_EQ(*EmbeddedDataDir(FakeEnv({{"XDG_DATA_HOME", "/x"}, {"HOME", "/h"}})),
            fs::path("/x/llmctl"));
  EXPECT_EQ(*EmbeddedDataDir(FakeEnv({{"HOME", "/h"}})), fs::path("/h/.local/share/llmctl"));
  Status relative = EmbeddedDataDir(FakeEnv({{"LLMCTL_HOME", "data"}})).status();
  EXPECT_EQ(relative.message(), "LLMCTL_HOME='data' is not an absolute path");
}

// The home directory by common/home_directory.h's rule, as the token cache and clouds.yaml take
// it: HOME when set, the password database's when HOME is unset or empty (where llmctl refused to
// start), a relative HOME refused naming it (where the config file was read relative to the
// directory llmctl ran in).
TEST(EmbeddedDataDirTest, HomeElseThePasswordDatabasesAndNeverARelativeHome) {
  const StatusOr<fs::path> entry = PasswordDatabaseHome(::getuid());
  ASSERT_TRUE(entry.ok()) << entry.status().ToString();
  for (const EnvLookup& unset : {FakeEnv({}), FakeEnv({{"HOME", ""}})}) {
    EXPECT_EQ(*EmbeddedDataDir(unset), *entry / ".local/share/llmctl");
    EXPECT_EQ(*ConfigFilePath(unset), *entry / ".config/llmctl/config.yaml");
  }
  EXPECT_EQ(*EmbeddedDataDir(FakeEnv({{"HOME", "/h"}})), fs::path("/h/.local/share/llmctl"));
  EXPECT_EQ(*ConfigFilePath(FakeEnv({{"HOME", "/h"}})), fs::path("/h/.config/llmctl/config.yaml"));

  const EnvLookup relative = FakeEnv({{"HOME", "h"}});
  const std::string refusal = HomeDirectory("h").status().message();
  EXPECT_EQ(EmbeddedDataDir(relative).status().message(), refusal);
  EXPECT_EQ(ConfigFilePath(relative), std::nullopt);
  const Status address = ResolveControllerAddress(relative).status();
  EXPECT_EQ(address.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(address.message(), refusal);
  // Nothing that needs no home reads HOME: a unix socket named in the environment, or XDG
  // directories for both the config file and the data.
  EXPECT_TRUE(
      ResolveControllerAddress(FakeEnv({{"HOME", "h"}, {"LLMCTL_CONTROLLER", "unix:/tmp/c.sock"}}))
          .ok());
  StatusOr<ControllerAddress> xdg = ResolveControllerAddress(
      FakeEnv({{"HOME", "h"}, {"XDG_CONFIG_HOME", "/nonexistent"}, {"XDG_DATA_HOME", "/x"}}));
  ASSERT_TRUE(xdg.ok()) << xdg.status().ToString();
  EXPECT_EQ(xdg->data_dir, fs::path("/x/llmctl"));
}

}  // namespace
}  // namespace llmctl::cli
