// The cloud path end to end with the built `llmctl` as a user runs it: lease create --wait, node
// up, submit --wait, report, node down, lease delete, daemon stop, against the OpenStack simulator
// following the system's clock. No node boots: once `node up` has made the server, the test reads
// the user-data Nova was given (the CA certificate and the node's one-time enrollment token) and
// starts an llm-agent with them on the floating IP (127.0.0.x, loopback), as cloud-init would on
// the node; `node up` then enrolls it over the link. A shell script stands in for llm-train (the
// trainer's own tests cover it).
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>
#include <yaml-cpp/yaml.h>

#include <chrono>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <future>
#include <iomanip>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/child_process.h"
#include "tests/openstack_sim/simulator.h"
#include "tests/support/shell_command.h"

namespace llmctl {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using testing::BuildDir;
using testing::CommandResult;

constexpr char kLease[] = "e2e";
constexpr char kFlavor[] = "g1.h100.pci.1";

// Two steps and an ok result; each run lasts long enough that the second trial finds the first
// one's agent busy and goes to the other, so both the local agent and the cloud node run one.
constexpr char kFakeTrainer[] = R"(#!/bin/sh
events="$4"
emit() { printf '%s\n' "$1" >> "$events"; }
emit '{"type":"start","total_steps":2}'
emit '{"type":"step","step":0,"loss":2.0}'
sleep 1
emit '{"type":"step","step":1,"loss":1.5}'
emit '{"type":"result","outcome":"ok","error":"","final_loss":1.5}'
)";

// A TCP port nobody listens on right now (the kernel's pick for port 0).
int FreePort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof(address);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) != 0) {
    ::close(fd);
    return -1;
  }
  ::close(fd);
  return ntohs(address.sin_port);
}

class CloudEndToEndTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto simulator = testing::Simulator::Start({"--wall-clock", "--region", region_});
    ASSERT_TRUE(simulator.ok()) << simulator.status().ToString();
    simulator_ = std::move(*simulator);
    // Nothing here boots: servers and volumes are ready at once, deletes finish at once.
    ASSERT_TRUE(simulator_->Admin("compute", {{"build_seconds", 0}, {"delete_seconds", 0}}).ok());
    ASSERT_TRUE(simulator_->Admin("storage", {{"volume_seconds", 0}}).ok());
    char pattern[] = "/tmp/llmctl-cloud-XXXXXX";  // short: unix socket paths live under it
    ASSERT_NE(::mkdtemp(pattern), nullptr);
    home_ = pattern;
    trainer_ = home_ / "fake-llm-train";
    std::ofstream(trainer_) << kFakeTrainer;
    fs::permissions(trainer_, fs::perms::owner_all);
  }

  void TearDown() override {
    if (agent_pid_ > 0) {
      ::kill(agent_pid_, SIGTERM);
      ::waitpid(agent_pid_, nullptr, 0);
    }
    if (home_.empty()) return;
    Llmctl("daemon stop");  // whatever happened above, no daemon outlives the test
    if (!HasFailure()) fs::remove_all(home_);
  }

  // `extra_env`: more NAME=VALUE words for the command's environment.
  CommandResult Llmctl(const std::string& args, const std::string& extra_env = "") {
    const openstack::EnvLookup cloud = simulator_->Environment({{"OS_REGION_NAME", region_}});
    std::string command = "env -u LLMCTL_CONTROLLER -u OS_CLOUD -u OS_USERNAME -u OS_PASSWORD";
    if (!extra_env.empty()) command += " " + extra_env;
    for (const char* name : {"OS_AUTH_URL", "OS_AUTH_TYPE", "OS_APPLICATION_CREDENTIAL_ID",
                             "OS_APPLICATION_CREDENTIAL_SECRET", "OS_REGION_NAME", "OS_INTERFACE",
                             "OS_IDENTITY_API_VERSION"}) {
      command += std::string(" ") + name + "=" + cloud(name).value_or("");
    }
    command += " LLMCTL_HOME=" + home_.string() +
               " XDG_CONFIG_HOME=" + (home_ / "config").string() +
               " LLMCTL_TRAIN_BIN=" + trainer_.string() + " " +
               (BuildDir() / "controller" / "cli" / "llmctl").string() + " " + args;
    return testing::RunShellCommand(command);
  }

  // The server's user-data and floating IP once `node up` has made both; null until then.
  json BootedServer() {
    auto books = simulator_->Books();
    if (!books.ok()) return nullptr;
    for (const json& server : (*books)["servers"]) {
      if (!server["user_data"].is_string()) continue;
      for (const json& ip : (*books)["floating_ips"]) {
        if (!ip["port_id"].is_null()) {
          return {{"user_data", server["user_data"]}, {"address", ip["floating_ip_address"]}};
        }
      }
    }
    return nullptr;
  }

  // What cloud-init would do on the node: write the files of the user-data's write_files and start
  // the agent on the floating IP, waiting to be enrolled.
  void StandInForNode(const json& server, int agent_port) {
    const std::string encoded = server["user_data"];
    {  // base64, as Nova takes it
      static const std::string kAlphabet =
          "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
      uint32_t bits = 0;
      int count = 0;
      for (char c : encoded) {
        const size_t value = kAlphabet.find(c);
        if (value == std::string::npos) continue;  // '=' padding
        bits = (bits << 6) | static_cast<uint32_t>(value);
        count += 6;
        if (count >= 8) {
          count -= 8;
          user_data_.push_back(static_cast<char>((bits >> count) & 0xff));
        }
      }
    }
    ASSERT_EQ(user_data_.rfind("#cloud-config\n", 0), 0u) << user_data_.substr(0, 200);
    const fs::path etc = home_ / "node-etc";
    fs::create_directories(etc);
    std::map<std::string, fs::path> written;
    for (const YAML::Node& file : YAML::Load(user_data_)["write_files"]) {
      const fs::path path = file["path"].as<std::string>();
      written[path.filename().string()] = etc / path.filename();
      std::ofstream(etc / path.filename()) << file["content"].as<std::string>();
      fs::permissions(etc / path.filename(), fs::perms::owner_read | fs::perms::owner_write);
    }
    for (const char* name : {"ca.pem", "enrollment.token"}) {
      ASSERT_EQ(written.count(name), 1u) << name << " is not in the user-data";
    }
    const fs::path credentials = home_ / "node-data" / "credentials";
    ChildSpec agent;
    agent.argv = {(BuildDir() / "agent" / "llm-agent").string(),
                  "--listen",
                  server["address"].get<std::string>() + ":" + std::to_string(agent_port),
                  "--data-dir",
                  (home_ / "node-data").string(),
                  "--node",
                  kLease,
                  "--ca",
                  written["ca.pem"].string(),
                  "--enrollment-token-file",
                  written["enrollment.token"].string(),
                  "--cert",
                  (credentials / "agent.pem").string(),
                  "--key",
                  (credentials / "agent.key").string(),
                  "--token-file",
                  (credentials / "agent.token").string(),
                  "--llm-train",
                  trainer_.string()};
    // As cloud-init would start it, but through StartChild, as the product starts its children:
    // killed if this test process dies first. One that cannot be executed exits 127, why on
    // standard error.
    agent.exec_failure = ExecFailureReport::kStderrAndExitCode;
    agent.exec_failure_message = "llm-agent: ";
    const StatusOr<pid_t> started = StartChild(agent);
    agent_pid_ = started.ok() ? *started : -1;
    ASSERT_GE(agent_pid_, 0);
  }

  // The site the simulator plays (its Keystone's region).
  std::string region_ = "KVM@TACC";
  std::string user_data_;  // what StandInForNode read, decoded
  std::unique_ptr<testing::Simulator> simulator_;
  fs::path home_;
  fs::path trainer_;
  pid_t agent_pid_ = -1;
};

TEST_F(CloudEndToEndTest, LeaseNodeSubmitReportAndNothingLeftBehind) {
  CommandResult lease =
      Llmctl(std::string("lease create --flavor ") + kFlavor + " --name " + kLease + " --wait");
  ASSERT_EQ(lease.exit_code, 0) << lease.out;

  const int agent_port = FreePort();
  ASSERT_GT(agent_port, 0);
  std::future<CommandResult> node_up = std::async(std::launch::async, [&] {
    return Llmctl(
        std::string("node up --lease ") + kLease +
        " --key-name demo-key --agent-image registry.example/llm-agent:test --agent-port " +
        std::to_string(agent_port));
  });
  json server;
  for (int i = 0; i < 300 && server.is_null(); ++i) {
    if (node_up.wait_for(std::chrono::milliseconds(50)) == std::future_status::ready) break;
    server = BootedServer();
  }
  ASSERT_FALSE(server.is_null()) << node_up.get().out;
  StandInForNode(server, agent_port);
  const CommandResult up = node_up.get();
  ASSERT_EQ(up.exit_code, 0) << up.out;
  EXPECT_NE(up.out.find("node e2e: enrolled (its certificate and token went over the link)"),
            std::string::npos)
      << up.out;
  EXPECT_NE(up.out.find("node e2e: the agent answers"), std::string::npos) << up.out;
  // What any process on the node can read back from the metadata service holds no credential:
  // the agent's key and token came over the link into 0600 files of its own.
  const fs::path credentials = home_ / "node-data" / "credentials";
  for (const char* name : {"agent.pem", "agent.key", "agent.token"}) {
    ASSERT_TRUE(fs::exists(credentials / name)) << name;
    EXPECT_EQ(fs::status(credentials / name).permissions() & fs::perms::all,
              fs::perms::owner_read | fs::perms::owner_write)
        << name;
  }
  std::string node_token;
  std::ifstream(credentials / "agent.token") >> node_token;
  EXPECT_EQ(node_token.size(), 64u);
  EXPECT_EQ(user_data_.find(node_token), std::string::npos);
  EXPECT_EQ(user_data_.find("PRIVATE KEY"), std::string::npos);

  const fs::path experiment = home_ / "tiny.yaml";
  fs::copy_file("experiments/data/alpaca-demo.jsonl", home_ / "train.jsonl");
  fs::copy_file("experiments/tokenizers/demo/tokenizer.json", home_ / "tokenizer.json");
  std::ofstream(experiment) << "name: cloud-e2e\n"
                               "model: llmctl-demo\n"
                               "init: random\n"
                               "tokenizer: tokenizer.json\n"
                               "data: {path: train.jsonl, max_seq_length: 64}\n"
                               "train: {micro_batch_size: 2, max_steps: 2}\n"
                               "trials:\n"
                               "  - {name: first, expect: ok}\n"
                               "  - {name: second, expect: ok}\n";
  CommandResult submitted = Llmctl("submit " + experiment.string() + " --wait");
  ASSERT_EQ(submitted.exit_code, 0) << submitted.out;
  const std::string id = submitted.out.substr(0, submitted.out.find('\n'));

  CommandResult report = Llmctl("report " + id + " --format json");
  ASSERT_EQ(report.exit_code, 0) << report.out;
  const json trials = json::parse(report.out)["trials"];
  ASSERT_EQ(trials.size(), 2u) << report.out;
  std::set<std::string> nodes;
  for (const json& trial : trials) {
    EXPECT_EQ(trial["outcome"], "ok") << trial.dump();
    EXPECT_EQ(trial["final_loss"], 1.5) << trial.dump();
    nodes.insert(trial["node"].get<std::string>());
  }
  EXPECT_EQ(nodes, (std::set<std::string>{"local", kLease})) << report.out;

  CommandResult down = Llmctl(std::string("node down ") + kLease);
  ASSERT_EQ(down.exit_code, 0) << down.out;
  EXPECT_NE(down.out.find("controller: node e2e removed"), std::string::npos) << down.out;
  // The controller forgot the node at once; the report still names it for the trial it ran.
  CommandResult listed = Llmctl("nodes");
  ASSERT_EQ(listed.exit_code, 0) << listed.out;
  EXPECT_NE(listed.out.find("\nlocal "), std::string::npos) << listed.out;
  EXPECT_EQ(listed.out.find(std::string("\n") + kLease + " "), std::string::npos) << listed.out;
  CommandResult history = Llmctl("report " + id + " --format json");
  ASSERT_EQ(history.exit_code, 0) << history.out;
  EXPECT_EQ(json::parse(history.out)["trials"], trials) << history.out;
  // Running it again is safe: nothing is left to delete, and the controller says so.
  CommandResult again = Llmctl(std::string("node down ") + kLease);
  EXPECT_EQ(again.exit_code, 0) << again.out;
  EXPECT_NE(again.out.find("controller: node e2e was already removed at "), std::string::npos)
      << again.out;
  // With the controller unreachable it still deletes (nothing, here), warns and exits 3.
  const std::string nobody = "unix:" + (home_ / "nobody.sock").string();
  CommandResult unreachable =
      Llmctl(std::string("node down ") + kLease, "LLMCTL_CONTROLLER=" + nobody);
  EXPECT_EQ(unreachable.exit_code, 3) << unreachable.out;
  EXPECT_NE(unreachable.out.find("warning: cannot tell the controller at " + nobody),
            std::string::npos)
      << unreachable.out;
  EXPECT_NE(unreachable.out.find("run `llmctl node down e2e` again"), std::string::npos)
      << unreachable.out;
  CommandResult deleted = Llmctl(std::string("lease delete ") + kLease);
  ASSERT_EQ(deleted.exit_code, 0) << deleted.out;

  auto books = simulator_->Books();
  ASSERT_TRUE(books.ok()) << books.status().ToString();
  for (const char* table : {"servers", "volumes", "floating_ips", "ports"}) {
    EXPECT_EQ((*books)[table], json::array()) << table;
  }
  for (const json& group : (*books)["security_groups"]) {
    EXPECT_EQ(group["description"].get<std::string>().rfind("llmctl:", 0), std::string::npos)
        << group.dump();
  }
  for (const json& lease_left : (*books)["leases"]) {
    EXPECT_NE(lease_left["name"], kLease) << lease_left.dump();
  }

  CommandResult stopped = Llmctl("daemon stop");
  EXPECT_EQ(stopped.exit_code, 0) << stopped.out;
}

// `submit --provision` at a bare-metal site: the lease reserves hosts by node type, sized from
// the trials' predicted time (multi-a100.yaml: OpenLLaMA 7B, predicted on the A100s of
// gpu_a100_pcie), or the labs' fixed lease when a trial's time cannot be predicted
// (single-a100.yaml: BLIP-2 from the hub). No agent image is given, so the node is not brought up:
// the lease is what is checked.
class ProvisionTest : public CloudEndToEndTest {
 protected:
  ProvisionTest() { region_ = "CHI@UC"; }

  // The lease `submit --provision FILE` made, and what submit printed.
  json Provision(const std::string& file, const std::string& lease_name, std::string& printed) {
    const CommandResult submitted = Llmctl("submit " + file + " --provision");
    printed = submitted.out;
    EXPECT_NE(submitted.exit_code, 0) << submitted.out;  // no agent image: no node
    EXPECT_NE(submitted.out.find("node up needs the agent's image"), std::string::npos)
        << submitted.out;
    auto books = simulator_->Books();
    EXPECT_TRUE(books.ok());
    if (!books.ok()) return nullptr;
    for (const json& lease : (*books)["leases"]) {
      if (lease["name"] == lease_name) return lease;
    }
    ADD_FAILURE() << "no lease " << lease_name << " in " << (*books)["leases"].dump();
    return nullptr;
  }
};

// Minutes between a lease's start and end ("2030-01-01 00:00" or ISO forms).
int64_t LeaseMinutes(const json& lease) {
  auto minutes_of = [](const std::string& text) {
    std::tm tm{};
    std::istringstream in(text.substr(0, 16));
    in >> std::get_time(&tm,
                        text.find('T') != std::string::npos ? "%Y-%m-%dT%H:%M" : "%Y-%m-%d %H:%M");
    return static_cast<int64_t>(::timegm(&tm)) / 60;
  };
  return minutes_of(lease["end_date"].get<std::string>()) -
         minutes_of(lease["start_date"].get<std::string>());
}

// The minutes submit said it provisions `lease` for: "provisioning lease L and its node for target
// T, 1h10m (sized from the prediction: ...)"; -1 when it did not say.
int64_t SaidMinutes(const std::string& printed, const std::string& lease,
                    const std::string& target) {
  const std::string said =
      "provisioning lease " + lease + " and its node for target " + target + ", ";
  const size_t at = printed.find(said);
  if (at == std::string::npos) return -1;
  const size_t start = at + said.size();
  const size_t end = printed.find(" (sized from the prediction: ", start);
  if (end == std::string::npos) return -1;
  int64_t minutes = 0;
  int64_t number = 0;
  for (char c : printed.substr(start, end - start)) {  // "1h10m", "50m", "1h"
    if (std::isdigit(static_cast<unsigned char>(c))) {
      number = number * 10 + (c - '0');
    } else {
      minutes += c == 'h' ? 60 * number : number;
      number = 0;
    }
  }
  return minutes;
}

TEST_F(ProvisionTest, ReservesHostsByNodeTypeForThePredictedTime) {
  std::string printed;
  const json lease =
      Provision("experiments/multi-a100.yaml", "llmctl-multi-a100-gpu-a100-pcie", printed);
  ASSERT_FALSE(lease.is_null());
  ASSERT_EQ(lease["reservations"].size(), 1u) << lease.dump();
  const json& reservation = lease["reservations"][0];
  EXPECT_EQ(reservation["resource_type"], "physical:host") << lease.dump();
  EXPECT_EQ(reservation["resource_properties"], "[\"==\", \"$node_type\", \"gpu_a100_pcie\"]");
  // The lease's length is what submit said it sized from the prediction.
  EXPECT_NEAR(LeaseMinutes(lease),
              SaidMinutes(printed, "llmctl-multi-a100-gpu-a100-pcie", "gpu_a100_pcie"), 1)
      << printed << lease.dump();
  EXPECT_LT(LeaseMinutes(lease), 170) << "shorter than the labs' fixed lease: " << printed;
}

// The current lab's BLIP-2 rows name their models on the hub; llmctl knows their shapes, so their
// lease is sized from the prediction too.
TEST_F(ProvisionTest, TheBlip2LabsHubModelsAreSizedFromThePrediction) {
  ASSERT_TRUE(
      simulator_->Admin("capacity", {{"hosts", {{{"id", "4"}, {"node_type", "compute_gigaio"}}}}})
          .ok());
  std::string printed;
  const json lease =
      Provision("experiments/single-a100.yaml", "llmctl-single-a100-compute-gigaio", printed);
  ASSERT_FALSE(lease.is_null());
  EXPECT_EQ(lease["reservations"][0]["resource_properties"],
            "[\"==\", \"$node_type\", \"compute_gigaio\"]");
  EXPECT_NEAR(LeaseMinutes(lease),
              SaidMinutes(printed, "llmctl-single-a100-compute-gigaio", "compute_gigaio"), 1)
      << printed << lease.dump();
  EXPECT_NE(printed.find("(sized from the prediction: 14 trials, "), std::string::npos)
      << printed;
}

}  // namespace
}  // namespace llmctl
