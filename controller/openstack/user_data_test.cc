#include "controller/openstack/user_data.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>
#include <yaml-cpp/yaml.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <utility>

#include "tests/support/shell_command.h"

namespace llmctl::openstack {
namespace {

constexpr char kToken[] = "enroll-S3CRET-never-logged";

std::string Pem(const std::string& kind, const std::string& body) {
  return "-----BEGIN " + kind + "-----\n" + body + "\n-----END " + kind + "-----\n";
}

BootstrapConfig PulledImage() {
  BootstrapConfig config;
  config.node = "lease1";
  config.agent_port = 7443;
  config.source.image = "registry.example.org/llmctl/agent:1.0";
  config.enrollment = {Pem("CERTIFICATE", "Q0FjZXJ0aWZpY2F0ZQ=="), kToken};
  return config;
}

BootstrapConfig BuiltFromGit() {
  BootstrapConfig config = PulledImage();
  config.source = {"", "https://github.com/example/llmctl.git",
                   "0123456789abcdef0123456789abcdef01234567"};
  return config;
}

// Runs `command` through the shell; its exit code and what it printed.
std::pair<int, std::string> Shell(const std::string& command) {
  testing::CommandResult run = testing::RunShellCommand(command);
  return {run.exit_code, std::move(run.out)};
}

bool HaveTool(const std::string& tool) { return Shell("command -v " + tool).first == 0; }

class TempDir {
 public:
  TempDir() {
    std::string pattern = (std::filesystem::temp_directory_path() / "user_data_test.XXXXXX");
    path_ = mkdtemp(pattern.data());
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  const std::string& path() const { return path_; }
  std::string Write(const std::string& name, const std::string& text) const {
    std::string file = path_ + "/" + name;
    std::ofstream(file) << text;
    return file;
  }

 private:
  std::string path_;
};

// The metadata service serves user data to any process on the node for the server's life: it
// holds the CA certificate (public) and the one-time enrollment token (spent once the agent is
// enrolled, dead after an hour), never a private key nor the node's token.
TEST(UserDataTest, CarriesOnlyTheCaAndTheEnrollmentTokenAs0600FilesAndRunsTheScript) {
  BootstrapConfig config = PulledImage();
  auto user_data = AgentUserData(config);
  ASSERT_TRUE(user_data.ok()) << user_data.status().ToString();
  ASSERT_TRUE(user_data->starts_with("#cloud-config\n"));
  YAML::Node root = YAML::Load(*user_data);
  std::map<std::string, std::pair<std::string, std::string>> files;
  for (const YAML::Node& file : root["write_files"]) {
    files[file["path"].as<std::string>()] = {file["permissions"].as<std::string>(),
                                             file["content"].as<std::string>()};
  }
  auto script = BootstrapScript(config);
  ASSERT_TRUE(script.ok());
  const std::map<std::string, std::pair<std::string, std::string>> expected = {
      {"/etc/llmctl/ca.pem", {"0600", config.enrollment.ca_pem}},
      {"/etc/llmctl/enrollment.token", {"0600", std::string(kToken) + "\n"}},
      {"/usr/local/sbin/llmctl-bootstrap", {"0700", *script}}};
  EXPECT_EQ(files, expected);
  EXPECT_EQ(user_data->find("PRIVATE KEY"), std::string::npos);
  EXPECT_EQ(user_data->find("agent.token\n"), std::string::npos);
  EXPECT_EQ(root["runcmd"][0][0].as<std::string>(), "/usr/local/sbin/llmctl-bootstrap");
  // The script itself holds no secret: it reads the files.
  EXPECT_EQ(script->find(kToken), std::string::npos);
}

TEST(UserDataTest, ScriptSetsUpTheGpuRuntimeAndStartsTheAgentWithItsFlags) {
  auto script = BootstrapScript(PulledImage());
  ASSERT_TRUE(script.ok()) << script.status().ToString();
  for (const char* expected :
       {"get.docker.com", "apt-get install -y -q nvidia-container-toolkit",
        "nvidia-ctk runtime configure --runtime=docker", "native.cgroupdriver=cgroupfs",
        "systemctl restart docker", "retry docker pull \"$IMAGE\"",
        "IMAGE=\"registry.example.org/llmctl/agent:1.0\"", "--gpus all",
        "-p \"$AGENT_PORT:$AGENT_PORT\"", "AGENT_PORT=7443", "NODE=\"lease1\"",
        // llm-agent's required flags (agent/main.cc).
        "--listen \"0.0.0.0:$AGENT_PORT\"", "--data-dir /var/lib/llmctl", "--node \"$NODE\"",
        "--ca \"$CONFIG_DIR/ca.pem\"", "--enrollment-token-file \"$CONFIG_DIR/enrollment.token\"",
        "CREDENTIALS_DIR=/var/lib/llmctl/credentials", "--cert \"$CREDENTIALS_DIR/agent.pem\"",
        "--key \"$CREDENTIALS_DIR/agent.key\"", "--token-file \"$CREDENTIALS_DIR/agent.token\"",
        "--llm-train /usr/local/bin/llm-train"}) {
    EXPECT_NE(script->find(expected), std::string::npos) << expected;
  }
  auto built = BootstrapScript(BuiltFromGit());
  ASSERT_TRUE(built.ok()) << built.status().ToString();
  EXPECT_NE(built->find("GIT_COMMIT=0123456789abcdef0123456789abcdef01234567"), std::string::npos);
  EXPECT_NE(built->find("docker build -f \"$SOURCE/deploy/Dockerfile\" -t \"$IMAGE\""),
            std::string::npos);
  EXPECT_EQ(built->find("docker pull"), std::string::npos);
}

// The script's driver step, run by bash with fake nvidia-smi, apt-get, modprobe and systemctl
// that log their arguments to `calls`.
class DriverStep {
 public:
  explicit DriverStep(const std::string& script) {
    const size_t begin = script.find("NVIDIA_DRIVER_BRANCH=");
    const size_t end = script.find("\n}\n", script.find("ensure_nvidia_driver() {"));
    functions_ = script.substr(begin, end + 3 - begin);
    const std::string log = " >>\"" + dir_.path() + "/calls\"\n";
    for (const char* tool : {"apt-get", "systemctl", "rmmod"}) {
      Tool(tool, "echo " + std::string(tool) + " \"$*\"" + log);
    }
    Tool("modprobe", "echo modprobe \"$*\"" + log + "[ ! -e \"" + dir_.path() + "/busy\" ]\n");
  }

  // Runs ensure_nvidia_driver with nvidia-smi reporting `driver` ("": no nvidia-smi); its exit
  // code, and the calls the fakes logged.
  std::pair<int, std::string> Run(const std::string& driver, bool modules_busy = false) {
    std::filesystem::remove(dir_.path() + "/nvidia-smi");
    std::filesystem::remove(dir_.path() + "/calls");
    if (!driver.empty()) Tool("nvidia-smi", "echo " + driver + "\n");
    if (modules_busy) dir_.Write("busy", "");
    const std::string step = dir_.Write(
        "step.sh", "set -euo pipefail\nretry() { \"$@\"; }\n" + functions_ + "PER_BOOT=\"" +
                       dir_.path() + "/per-boot/llmctl-bootstrap\"\nensure_nvidia_driver\n");
    const auto [code, output] = Shell("PATH=\"" + dir_.path() + ":/usr/bin:/bin\" bash " + step);
    std::ifstream calls(dir_.path() + "/calls");
    return {code, std::string(std::istreambuf_iterator<char>(calls), {})};
  }

  bool ScriptRunsAtNextBoot() const {
    return std::filesystem::exists(dir_.path() + "/per-boot/llmctl-bootstrap");
  }

 private:
  void Tool(const std::string& name, const std::string& body) {
    std::filesystem::permissions(dir_.Write(name, "#!/bin/sh\n" + body),
                                 std::filesystem::perms::owner_all);
  }

  TempDir dir_;
  std::string functions_;
};

TEST(UserDataTest, ADriverTooOldForCuda13IsReplacedAndLoaded) {
  if (!HaveTool("bash")) GTEST_SKIP() << "bash is not installed";
  auto script = BootstrapScript(PulledImage());
  ASSERT_TRUE(script.ok()) << script.status().ToString();
  // The step runs before the container toolkit, whose docker run needs the driver.
  ASSERT_LT(script->find("\nensure_nvidia_driver\n"), script->find("\nretry install_docker\n"));
  DriverStep step(*script);

  // CC-Ubuntu24.04-CUDA's driver: replaced and loaded without a reboot (nothing holds it).
  auto [code, calls] = step.Run("560.35.03");
  EXPECT_EQ(code, 0);
  EXPECT_NE(calls.find("apt-get install -y -q nvidia-driver-580\n"), std::string::npos) << calls;
  EXPECT_NE(calls.find("modprobe nvidia\nmodprobe nvidia_uvm\n"), std::string::npos) << calls;
  EXPECT_FALSE(step.ScriptRunsAtNextBoot());

  // A driver new enough, or none at all (a CPU node): nothing to do.
  for (const char* driver : {"580.95.05", "590.44.01", ""}) {
    std::tie(code, calls) = step.Run(driver);
    EXPECT_EQ(code, 0) << driver;
    EXPECT_EQ(calls, "") << driver;
  }

  // The old driver's modules cannot be unloaded: the script reboots and runs again after it.
  std::tie(code, calls) = step.Run("550.54.15", /*modules_busy=*/true);
  EXPECT_EQ(code, 0);
  EXPECT_NE(calls.find("systemctl reboot\n"), std::string::npos) << calls;
  EXPECT_TRUE(step.ScriptRunsAtNextBoot());
}

TEST(UserDataTest, PassesCloudInitSchema) {
  if (!HaveTool("cloud-init")) GTEST_SKIP() << "cloud-init is not installed (Debian: cloud-init)";
  TempDir dir;
  for (const BootstrapConfig& config : {PulledImage(), BuiltFromGit()}) {
    auto user_data = AgentUserData(config);
    ASSERT_TRUE(user_data.ok());
    std::string file = dir.Write("user-data", *user_data);
    auto [code, output] = Shell("cloud-init schema --config-file " + file);
    EXPECT_EQ(code, 0) << output;
    EXPECT_NE(output.find("Valid cloud-config"), std::string::npos) << output;
  }
  // And the check can fail: a misspelt key is reported.
  std::string broken =
      dir.Write("broken", "#cloud-config\nwrite_files:\n  - path: 7\n    permisions: 1\n");
  EXPECT_NE(Shell("cloud-init schema --config-file " + broken).first, 0);
}

TEST(UserDataTest, ScriptPassesShellcheck) {
  if (!HaveTool("shellcheck")) GTEST_SKIP() << "shellcheck is not installed";
  TempDir dir;
  for (const BootstrapConfig& config : {PulledImage(), BuiltFromGit()}) {
    auto script = BootstrapScript(config);
    ASSERT_TRUE(script.ok());
    auto [code, output] =
        Shell("shellcheck --severity=style " + dir.Write("bootstrap.sh", *script));
    EXPECT_EQ(code, 0) << output;
  }
  auto [code, output] = Shell("shellcheck " + dir.Write("bad.sh", "#!/bin/bash\nrm -rf $1/x\n"));
  EXPECT_NE(code, 0) << "shellcheck accepted an unquoted expansion";
}

TEST(UserDataTest, BadInputNamesTheFieldAndNeverTheSecret) {
  auto message = [](const BootstrapConfig& config) {
    auto result = AgentUserData(config);
    EXPECT_FALSE(result.ok());
    EXPECT_EQ(result.status().code(), StatusCode::kInvalidArgument);
    return result.status().message();
  };
  BootstrapConfig config = PulledImage();
  config.node = "bad name";
  EXPECT_EQ(message(config), "node name 'bad name' must be 1-63 letters, digits, '-', '_' or '.'");
  config = PulledImage();
  config.agent_port = 70000;
  EXPECT_EQ(message(config), "agent port 70000 is not in 1-65535");
  config = BuiltFromGit();
  config.source.image = "also/an:image";
  EXPECT_NE(message(config).find("exactly one of"), std::string::npos);
  config = BuiltFromGit();
  config.source.git_commit = "main";
  EXPECT_NE(message(config).find("git commit 'main' is not a full 40-hex"), std::string::npos);
  config = BuiltFromGit();
  config.source.git_url = "https://example.org/$(reboot)";
  EXPECT_NE(message(config).find("is not an https:// or git@ URL"), std::string::npos);
  config = PulledImage();
  config.enrollment.ca_pem = "not a PEM\n";
  EXPECT_EQ(message(config), "bootstrap CA certificate is not a PEM block");
  config = PulledImage();
  config.enrollment.enrollment_token = std::string(kToken) + " x";
  std::string token_message = message(config);
  EXPECT_NE(token_message.find("enrollment token is empty or holds whitespace"), std::string::npos);
  EXPECT_EQ(token_message.find(kToken), std::string::npos);
}

TEST(UserDataTest, RefusesMoreThan64KiB) {
  BootstrapConfig config = PulledImage();
  config.enrollment.ca_pem = Pem("CERTIFICATE", std::string(70 * 1024, 'A'));
  auto result = AgentUserData(config);
  ASSERT_FALSE(result.ok());
  EXPECT_NE(result.status().message().find("cloud-init takes at most 65536"), std::string::npos)
      << result.status().message();
}

}  // namespace
}  // namespace llmctl::openstack
