#include "controller/openstack/node_cli.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <functional>
#include <memory>
#include <sstream>

#include "common/files.h"
#include "controller/openstack/lease_cli.h"
#include "controller/openstack/nova.h"
#include "tests/openstack_sim/hostile_text.h"
#include "tests/openstack_sim/simulator.h"
#include "tests/support/shell_command.h"

namespace llmctl::openstack {
namespace {

using llmctl::testing::CommandResult;
using llmctl::testing::ExpectNoControlsFromTheCloud;
using llmctl::testing::kHostile;
using llmctl::testing::kHostileShown;
using llmctl::testing::RunShellCommand;
using llmctl::testing::Simulator;
using nlohmann::json;

constexpr char kToken[] = "enrollment-token-S3CRET";

NodeEnrollment FakeEnrollment() {
  return {"-----BEGIN CERTIFICATE-----\nQUJDRA==\n-----END CERTIFICATE-----\n", kToken};
}

// One simulator for the binary; each test uses its own lease.
class NodeCliTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto sim = Simulator::Start();
    ASSERT_TRUE(sim.ok()) << sim.status().ToString();
    sim_ = std::move(*sim).release();
    ASSERT_TRUE(sim_->Admin("capacity", {{"flavor", {{"f-h100-1", 50}}}}).ok());
  }
  static void TearDownTestSuite() {
    delete sim_;
    sim_ = nullptr;
  }

  struct Result {
    int code;
    std::string out, err;
  };

  Result Node(const std::vector<std::string>& args,
              std::function<Status(const std::string&)> node_down = nullptr) {
    NodeCommandContext context;
    context.node_down = std::move(node_down);
    context.env = sim_->Environment();
    context.clock = &sim_->clock();
    context.http_options.sleep = [](std::chrono::milliseconds) {};
    context.issue_enrollment = [this](const std::string& node) -> StatusOr<NodeEnrollment> {
      issued_for_.push_back(node);
      return FakeEnrollment();
    };
    std::ostringstream out, err;
    int code = RunNodeCommand(args, out, err, context);
    EXPECT_EQ(out.str().find(kToken), std::string::npos);
    EXPECT_EQ(err.str().find(kToken), std::string::npos);
    return {code, out.str(), err.str()};
  }

  void ActiveLease(const std::string& name) {
    LeaseCommandContext context;
    context.env = sim_->Environment();
    context.clock = &sim_->clock();
    std::ostringstream out, err;
    ASSERT_EQ(RunLeaseCommand({"create", "--flavor", "g1.h100.pci.1", "--name", name, "--wait"},
                              out, err, context),
              0)
        << err.str();
  }

  static Simulator* sim_;
  std::vector<std::string> issued_for_;
};

Simulator* NodeCliTest::sim_ = nullptr;

TEST_F(NodeCliTest, UpListShowDown) {
  ActiveLease("cli");
  Result up = Node({"up", "--lease", "cli", "--agent-image", "registry.example.org/agent:1",
                    "--key-name", "demo-key", "--boot-volume", "120"});
  ASSERT_EQ(up.code, 0) << up.err;
  EXPECT_EQ(issued_for_, std::vector<std::string>{"cli"});
  EXPECT_NE(up.out.find("server:       llmctl-cli-server ("), std::string::npos) << up.out;
  EXPECT_NE(up.out.find(") ACTIVE\n"), std::string::npos) << up.out;
  EXPECT_NE(up.out.find("in-use, 120 GiB\n"), std::string::npos) << up.out;
  EXPECT_NE(up.out.find("agent:        127.0.0."), std::string::npos) << up.out;

  Result list = Node({"list"});
  ASSERT_EQ(list.code, 0) << list.err;
  std::istringstream lines(list.out);
  std::string header, row;
  std::getline(lines, header);
  std::getline(lines, row);
  EXPECT_TRUE(header.starts_with("NODE  STATUS  AGENT")) << header;
  EXPECT_TRUE(row.starts_with("cli   ACTIVE  127.0.0.")) << row;

  Result again = Node({"up", "--lease", "cli", "--agent-image", "registry.example.org/agent:1"});
  ASSERT_EQ(again.code, 0) << again.err;
  EXPECT_NE(again.out.find("server llmctl-cli-server ("), std::string::npos);
  EXPECT_NE(again.out.find(") exists: ACTIVE"), std::string::npos) << again.out;
  EXPECT_EQ(issued_for_.size(), 1u);  // no second certificate for a server that exists

  Result down = Node({"down", "cli"});
  ASSERT_EQ(down.code, 0) << down.err;
  EXPECT_NE(down.out.find("deleted server llmctl-cli-server"), std::string::npos) << down.out;
  EXPECT_NE(down.out.find("deleted boot volume llmctl-cli-boot"), std::string::npos);
  EXPECT_NE(down.out.find("released floating IP 127.0.0."), std::string::npos);
  EXPECT_NE(down.out.find("node cli is down\n"), std::string::npos);
  json books = *sim_->Books();
  EXPECT_EQ(books["servers"], json::array());
  EXPECT_EQ(books["volumes"], json::array());
  EXPECT_EQ(books["floating_ips"], json::array());
  EXPECT_EQ(books["ports"], json::array());
  EXPECT_EQ(books["security_groups"], json::array());
  EXPECT_EQ(Node({"down", "cli"}).code, 0);
  Result show = Node({"show", "cli"});
  EXPECT_EQ(show.code, 1);
  EXPECT_EQ(show.err,
            "llmctl node show: no node 'cli' (no server llmctl-cli-server, volume llmctl-cli-boot "
            "or floating IP)\n");
}

TEST_F(NodeCliTest, BadUsageIsRefusedBeforeAnythingIsMade) {
  int posts = sim_->CountRequests("POST", "/nova") + sim_->CountRequests("POST", "/cinder");
  Result no_image = Node({"up", "--lease", "x"});
  EXPECT_EQ(no_image.code, 2);
  EXPECT_NE(no_image.err.find("node up needs the agent's image"), std::string::npos);
  Result both = Node(
      {"up", "--lease", "x", "--agent-image", "a/b:c", "--agent-git", "https://example.org/r.git"});
  EXPECT_EQ(both.code, 2);
  EXPECT_EQ(both.err, "llmctl node up: give --agent-image or --agent-git, not both\n");
  Result unpinned = Node({"up", "--lease", "x", "--agent-git", "https://example.org/r.git"});
  EXPECT_EQ(unpinned.code, 2);
  EXPECT_EQ(unpinned.err,
            "llmctl node up: --agent-git needs --agent-commit (the build is pinned)\n");
  Result port = Node({"up", "--lease", "x", "--agent-image", "a/b:c", "--agent-port", "0"});
  EXPECT_EQ(port.code, 2);
  EXPECT_EQ(port.err, "llmctl node up: agent port 0 is not in 1-65535\n");
  Result unknown_lease = Node({"up", "--lease", "nosuch", "--agent-image", "a/b:c"});
  EXPECT_EQ(unknown_lease.code, 1);
  EXPECT_NE(unknown_lease.err.find("no lease named 'nosuch'"), std::string::npos)
      << unknown_lease.err;
  EXPECT_EQ(Node({"frobnicate"}).code, 2);
  EXPECT_EQ(sim_->CountRequests("POST", "/nova") + sim_->CountRequests("POST", "/cinder"), posts);
}

TEST_F(NodeCliTest, DownTellsTheControllerFirstAndStillDeletesWhenItDoesNotAnswer) {
  ActiveLease("gone");
  ASSERT_EQ(Node({"up", "--lease", "gone", "--agent-image", "registry.example.org/agent:1"}).code,
            0);
  std::vector<std::string> told;
  size_t servers_when_told = 0;
  Result down = Node({"down", "gone"}, [&](const std::string& node) {
    told.push_back(node);
    servers_when_told = (*sim_->Books())["servers"].size();
    return UnavailableError(
        "cannot tell the controller at unix:/run/c.sock (from LLMCTL_CONTROLLER) that node gone "
        "is going: connection refused");
  });
  EXPECT_EQ(down.code, 3) << down.err;
  EXPECT_EQ(told, std::vector<std::string>{"gone"});
  EXPECT_EQ(servers_when_told, 1u) << "the controller is told before anything is deleted";
  EXPECT_NE(down.err.find("llmctl node down: warning: cannot tell the controller at "
                          "unix:/run/c.sock (from LLMCTL_CONTROLLER) that node gone is going"),
            std::string::npos)
      << down.err;
  EXPECT_NE(down.err.find("once the controller answers, run `llmctl node down gone` again"),
            std::string::npos)
      << down.err;
  EXPECT_NE(down.out.find("node gone is down\n"), std::string::npos) << down.out;
  json books = *sim_->Books();
  for (const char* table : {"servers", "volumes", "floating_ips", "ports"}) {
    EXPECT_EQ(books[table], json::array()) << table;
  }
  // Rerunning once the controller answers is safe and ends well.
  Result again = Node({"down", "gone"}, [](const std::string&) { return Status::Ok(); });
  EXPECT_EQ(again.code, 0) << again.err;

  // Any other answer from the controller stops `node down` before anything is deleted.
  ActiveLease("kept");
  ASSERT_EQ(Node({"up", "--lease", "kept", "--agent-image", "registry.example.org/agent:1"}).code,
            0);
  Result refused = Node({"down", "kept"}, [](const std::string&) {
    return FailedPreconditionError("the controller cannot write its database");
  });
  EXPECT_EQ(refused.code, 1);
  EXPECT_EQ(refused.err, "llmctl node down: the controller cannot write its database\n");
  EXPECT_EQ((*sim_->Books())["servers"].size(), 1u);
  EXPECT_EQ(Node({"down", "kept"}).code, 0);
}

TEST_F(NodeCliTest, NovasFaultReachesNoTerminalRaw) {
  ActiveLease("faulty");
  ASSERT_TRUE(
      sim_->Admin("compute", {{"fail_servers", {{NamesForNode("faulty").server, kHostile}}}}).ok());
  Result up = Node({"up", "--lease", "faulty", "--agent-image", "registry.example.org/agent:1"});
  EXPECT_EQ(up.code, 1);
  ExpectNoControlsFromTheCloud(up.out);
  ExpectNoControlsFromTheCloud(up.err);
  // The error is one line, Nova's fault in it.
  EXPECT_EQ(std::count(up.err.begin(), up.err.end(), '\n'), 1) << up.err;
  EXPECT_TRUE(up.err.starts_with("llmctl node up: server ")) << up.err;
  EXPECT_NE(up.err.find(std::string("failed to build: ").append(kHostileShown).append("; ")),
            std::string::npos)
      << up.err;

  Result show = Node({"show", "faulty"});
  ASSERT_EQ(show.code, 0) << show.err;
  ExpectNoControlsFromTheCloud(show.out);
  EXPECT_NE(show.out.find(std::string(") ERROR: ").append(kHostileShown).append("\n")),
            std::string::npos)
      << show.out;
  EXPECT_EQ(Node({"down", "faulty"}).code, 0);
}

// A server anyone in the project named like a node's: `node list`, `show` and `down` print its
// name without its controls.
TEST_F(NodeCliTest, AServerNameReachesNoTerminalRaw) {
  http::ClientOptions options;
  options.sleep = [](std::chrono::milliseconds) {};
  http::HttpClient http(options);
  StatusOr<Credentials> creds = CredentialsFromEnvironment(sim_->Environment());
  ASSERT_TRUE(creds.ok()) << creds.status().ToString();
  Session session(*creds, http, sim_->clock());
  NovaClient nova(session, sim_->clock());
  ServerSpec spec;
  spec.flavor_id = "f-small";
  spec.image_id = "img-ubuntu-2204";
  spec.network_id = "net-sharednet1";
  spec.name = NamesForNode(kHostile).server;
  StatusOr<Server> server = nova.FindOrCreateServer(spec);
  ASSERT_TRUE(server.ok()) << server.status().ToString();

  Result list = Node({"list"});
  ASSERT_EQ(list.code, 0) << list.err;
  ExpectNoControlsFromTheCloud(list.out);
  EXPECT_NE(list.out.find(std::string("\n").append(kHostileShown).append("  ")), std::string::npos)
      << list.out;
  Result show = Node({"show", kHostile});
  ASSERT_EQ(show.code, 0) << show.err;
  ExpectNoControlsFromTheCloud(show.out);
  EXPECT_NE(show.out.find(std::string("node:         ").append(kHostileShown).append("\n")),
            std::string::npos)
      << show.out;
  EXPECT_NE(show.out.find(std::string("server:       llmctl-").append(kHostileShown)),
            std::string::npos)
      << show.out;
  Result down = Node({"down", kHostile});
  ASSERT_EQ(down.code, 0) << down.err;
  ExpectNoControlsFromTheCloud(down.out);
  EXPECT_NE(down.out.find(std::string("deleted server llmctl-").append(kHostileShown)),
            std::string::npos)
      << down.out;
  EXPECT_NE(down.out.find(std::string("node ").append(kHostileShown).append(" is down\n")),
            std::string::npos)
      << down.out;
}

// The controller's words in `node down`'s warning: one line, no controls.
TEST_F(NodeCliTest, TheControllersWarningReachesNoTerminalRaw) {
  ActiveLease("warned");
  ASSERT_EQ(Node({"up", "--lease", "warned", "--agent-image", "registry.example.org/agent:1"}).code,
            0);
  Result down = Node({"down", "warned"}, [](const std::string&) {
    return UnavailableError(std::string("cannot tell the controller: ").append(kHostile));
  });
  EXPECT_EQ(down.code, 3);
  ExpectNoControlsFromTheCloud(down.err);
  // The warning and the error, one line each.
  EXPECT_EQ(std::count(down.err.begin(), down.err.end(), '\n'), 2) << down.err;
  EXPECT_NE(down.err.find(std::string("llmctl node down: warning: cannot tell the controller: ")
                              .append(kHostileShown)
                              .append("; deleting")),
            std::string::npos)
      << down.err;
}

// Debian's openstack CLI (python-openstackclient, openstacksdk: nobody here wrote them) sees
// what `node up` made in the simulator.
TEST_F(NodeCliTest, TheOpenstackCliSeesWhatNodeUpMade) {
  if (RunShellCommand("command -v openstack").exit_code != 0) {
    GTEST_SKIP() << "the openstack CLI is not installed (Debian: python3-openstackclient)";
  }
  ActiveLease("xcheck");
  Result up = Node({"up", "--lease", "xcheck", "--agent-image", "registry.example.org/agent:1"});
  ASSERT_EQ(up.code, 0) << up.err;
  std::string env = "env -i PATH=/usr/bin:/bin HOME=/nonexistent OS_AUTH_URL=" + sim_->auth_url() +
                    " OS_AUTH_TYPE=v3applicationcredential"
                    " OS_APPLICATION_CREDENTIAL_ID=ac-unrestricted"
                    " OS_APPLICATION_CREDENTIAL_SECRET=ac-secret OS_REGION_NAME=KVM@TACC"
                    " OS_INTERFACE=public OS_IDENTITY_API_VERSION=3 openstack ";
  // The listing is its standard output alone: its standard error, kept apart, says why it failed,
  // and would break the JSON where the CLI (Python) warns of something on a listing that works.
  const std::filesystem::path errors =
      std::filesystem::temp_directory_path() /
      ("node-cli-openstack-" + std::to_string(::getpid()) + ".err");
  auto list = [&](const std::string& what) {
    const CommandResult listed = RunShellCommand(env + what + " -f json 2>" + errors.string());
    const StatusOr<std::string> error_text = ReadFileToString(errors.string());
    EXPECT_EQ(listed.exit_code, 0)
        << what << ": " << listed.out << (error_text.ok() ? *error_text : "");
    json parsed = json::parse(listed.out, nullptr, false);
    EXPECT_TRUE(parsed.is_array())
        << what << ": " << listed.out << (error_text.ok() ? *error_text : "");
    return parsed.is_array() ? parsed : json::array();
  };
  json books = *sim_->Books();
  json servers = list("server list");
  ASSERT_EQ(servers.size(), 1u) << servers;
  EXPECT_EQ(servers[0]["Name"], "llmctl-xcheck-server");
  EXPECT_EQ(servers[0]["Status"], "ACTIVE");
  EXPECT_EQ(servers[0]["ID"], books["servers"][0]["id"]);
  json volumes = list("volume list");
  ASSERT_EQ(volumes.size(), 1u) << volumes;
  EXPECT_EQ(volumes[0]["Name"], "llmctl-xcheck-boot");
  EXPECT_EQ(volumes[0]["Status"], "in-use");
  json groups = list("security group list");
  std::vector<std::string> names;
  for (const json& group : groups) names.push_back(group["Name"]);
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"allow-llmctl-agent-7443", "allow-ssh"}));
  json addresses = list("floating ip list");
  ASSERT_EQ(addresses.size(), 1u) << addresses;
  EXPECT_EQ(addresses[0]["Floating IP Address"], books["floating_ips"][0]["floating_ip_address"]);
  EXPECT_EQ(addresses[0]["Port"], books["floating_ips"][0]["port_id"]);

  ASSERT_EQ(Node({"down", "xcheck"}).code, 0);
  std::filesystem::remove(errors);
}

}  // namespace
}  // namespace llmctl::openstack
