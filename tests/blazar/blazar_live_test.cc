// `llmctl lease` (controller/openstack/lease_cli) against the real Blazar (blazar 18.0.0 from PyPI,
// tests/blazar/blazar_local.py) behind the real Keystone (tests/keystone), with the simulator
// (tests/openstack_sim) as the Nova and Placement that Blazar's host and flavor plugins ask. Three
// hosts: node-1 and node-2 of node type gpu_a100_pcie, node-3 of compute_cascadelake. One Blazar
// serves the whole binary and the tests run in order on it; where it cannot start, every test fails
// with the reason (scripts/setup.sh --tests installs it): a Blazar that does not start is a fault
// to see, not a skip. Every refusal asserted here is the text the real Blazar sent.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <chrono>
#include <filesystem>
#include <iostream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "common/utc_time.h"
#include "controller/openstack/cloud_clock.h"
#include "controller/openstack/lease_cli.h"
#include "tests/keystone/local_keystone.h"
#include "tests/openstack_sim/simulator.h"
#include "tests/support/local_script.h"
#include "tests/support/shell_command.h"

namespace llmctl::testing {
namespace {

using openstack::LeaseCommandContext;
using openstack::RunLeaseCommand;
using openstack::TimePoint;
using namespace std::chrono_literals;
namespace fs = std::filesystem;

constexpr auto kStartTimeout = 240s;

struct LeaseResult {
  int exit_code = -1;
  std::string out, err;
};

class BlazarLiveTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    start_error_ = new std::string();
    std::string pattern =
        (std::filesystem::temp_directory_path() / "llmctl-blazar-XXXXXX").string();
    dir_ = new std::string(mkdtemp(pattern.data()) ? pattern : "");
    if (dir_->empty()) {
      *start_error_ = "could not make a temporary directory";
      return;
    }
    Status started = Start();
    if (!started.ok()) *start_error_ = started.ToString();
  }

  // The simulator (wall clock), Keystone with its catalog on the simulator, then Blazar.
  static Status Start() {
    const auto start = std::chrono::steady_clock::now();
    ASSIGN_OR_RETURN(std::unique_ptr<Simulator> sim, Simulator::Start({"--wall-clock"}));
    sim_ = sim.release();
    ASSIGN_OR_RETURN(std::unique_ptr<LocalKeystone> keystone,
                     LocalKeystone::Spawn(*dir_, {"--services-url", sim_->url()}));
    keystone_ = keystone.release();
    ASSIGN_OR_RETURN(KeystoneInfo info, keystone_->Wait(kStartTimeout));
    info_ = new KeystoneInfo(info);
    const auto keystone_ready = std::chrono::steady_clock::now();
    ASSIGN_OR_RETURN(
        std::unique_ptr<LocalScript> blazar,
        LocalScript::Spawn(
            "tests/blazar/blazar_local.py", *dir_, "blazar",
            // "--admin-password=" and the password as one argument: the password is
            // token_urlsafe's, which begins with '-' one time in 64, and argparse took such a
            // separate value for an option and refused the command line.
            {"--auth-url", info.auth_url, "--admin-password=" + info.admin_password, "--region",
             info.region, "--services-url", sim_->url(), "--host", "node-1=gpu_a100_pcie", "--host",
             "node-2=gpu_a100_pcie", "--host", "node-3=compute_cascadelake"}));
    blazar_ = blazar.release();
    ASSIGN_OR_RETURN(std::string line, blazar_->WaitLine(kStartTimeout));
    auto json = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!json.is_object() || !json.contains("url") || !json["url"].is_string()) {
      return InternalError("blazar_local.py printed '" + line + "' instead of its JSON line");
    }
    std::cout << "Keystone served after " << Seconds(keystone_ready - start) << " s, Blazar at "
              << json["url"].get<std::string>() << " after "
              << Seconds(std::chrono::steady_clock::now() - keystone_ready) << " s more\n";
    return Status::Ok();
  }

  static double Seconds(std::chrono::steady_clock::duration duration) {
    return std::chrono::duration<double>(duration).count();
  }

  static void TearDownTestSuite() {
    for (LocalScript* script : {blazar_}) {
      if (script != nullptr) {
        Status stopped = script->Stop();
        EXPECT_TRUE(stopped.ok()) << stopped.ToString();
      }
    }
    if (keystone_ != nullptr) {
      Status stopped = keystone_->Stop();
      EXPECT_TRUE(stopped.ok()) << stopped.ToString();
    }
    delete blazar_;
    delete keystone_;
    delete sim_;
    blazar_ = nullptr;
    keystone_ = nullptr;
    sim_ = nullptr;
    if (!start_error_->empty() || ::testing::UnitTest::GetInstance()->failed_test_count() > 0) {
      std::cout << "Keystone's and Blazar's files and logs stay in " << *dir_ << "\n";
    } else if (!dir_->empty()) {
      std::filesystem::remove_all(*dir_);
    }
    delete info_;
    delete start_error_;
    delete dir_;
    info_ = nullptr;
  }

  void SetUp() override {
    ASSERT_TRUE(start_error_->empty()) << "Blazar did not start: " << *start_error_;
  }

  // `llmctl lease ARGS` with only `environment`'s OS_* variables, on the system's clock.
  static LeaseResult Lease(
      const std::vector<std::string>& args,
      const std::map<std::string, std::string>& environment = info_->PasswordEnvironment()) {
    LeaseCommandContext context;
    context.env = [environment](const std::string& name) -> std::optional<std::string> {
      auto found = environment.find(name);
      if (found == environment.end()) return std::nullopt;
      return found->second;
    };
    context.blazar_options.poll_interval = 1s;  // the manager starts due leases every second
    context.wait_timeout = 60s;
    std::ostringstream out, err;
    LeaseResult result;
    result.exit_code = RunLeaseCommand(args, out, err, context);
    result.out = out.str();
    result.err = err.str();
    return result;
  }

  // The built `llmctl ARGS` as a user runs it, with the password user's OS_* variables, its own
  // LLMCTL_HOME (an embedded controller) and no other cloud or controller settings.
  static CommandResult Llmctl(const std::string& args) {
    std::string command = "env -u LLMCTL_CONTROLLER -u OS_CLOUD";
    for (const auto& [name, value] : info_->PasswordEnvironment()) {
      command += " " + name + "='" + value + "'";
    }
    const fs::path home = fs::path(*dir_) / "llmctl-home";
    command += " LLMCTL_HOME=" + home.string() + " XDG_CONFIG_HOME=" + (home / "config").string() +
               " " + (BuildDir() / "controller" / "cli" / "llmctl").string() + " " + args;
    return RunShellCommand(command);
  }

  // The first whole minute at least 15 s from now: Blazar takes start dates to the minute, so a
  // lease starting then is PENDING for 15 to 75 s.
  static TimePoint NextMinute() {
    const auto at =
        std::chrono::floor<std::chrono::minutes>(std::chrono::system_clock::now() + 15s + 1min);
    return std::chrono::time_point_cast<TimePoint::duration>(at);
  }

  // Whether a printed lease that starts now is PENDING or STARTING: Blazar's manager answers the
  // POST with the lease as it reads it back, PENDING before its event loop starts it, STARTING
  // where the loop got there first (a loaded machine: seen 11-30 during a parallel make test).
  static bool PendingOrStarting(const std::string& printed) {
    return printed.find("status:       PENDING") != std::string::npos ||
           printed.find("status:       STARTING") != std::string::npos;
  }

  // "end (UTC):  YYYY-MM-DD HH:MM" of a printed lease.
  static std::string EndOf(const std::string& printed) {
    size_t at = printed.find("end (UTC):");
    return at == std::string::npos ? "" : printed.substr(at + 14, 16);
  }

  static std::string* dir_;
  static std::string* start_error_;
  static Simulator* sim_;
  static LocalKeystone* keystone_;
  static LocalScript* blazar_;
  static KeystoneInfo* info_;
};

std::string* BlazarLiveTest::dir_ = nullptr;
std::string* BlazarLiveTest::start_error_ = nullptr;
Simulator* BlazarLiveTest::sim_ = nullptr;
LocalKeystone* BlazarLiveTest::keystone_ = nullptr;
LocalScript* BlazarLiveTest::blazar_ = nullptr;
KeystoneInfo* BlazarLiveTest::info_ = nullptr;

#define EXPECT_EXIT_CODE(result, code) \
  EXPECT_EQ((result).exit_code, code) << "out: " << (result).out << "\nerr: " << (result).err

TEST_F(BlazarLiveTest, NodeTypeLeaseGoesFromPendingToActiveIsShownListedExtendedAndDeleted) {
  LeaseResult created =
      Lease({"create", "--node-type", "gpu_a100_pcie", "--duration", "1h", "--name", "live-a"});
  EXPECT_EXIT_CODE(created, 0);
  EXPECT_TRUE(PendingOrStarting(created.out)) << created.out;
  EXPECT_NE(created.out.find("physical:host pending (1 x [\"==\", \"$node_type\", "
                             "\"gpu_a100_pcie\"])"),
            std::string::npos)
      << created.out;

  LeaseResult waited = Lease(
      {"create", "--node-type", "gpu_a100_pcie", "--duration", "1h", "--name", "live-b", "--wait"});
  EXPECT_EXIT_CODE(waited, 0);
  EXPECT_NE(waited.out.find("status:       ACTIVE"), std::string::npos) << waited.out;
  EXPECT_NE(waited.out.find("physical:host active"), std::string::npos) << waited.out;

  LeaseResult shown = Lease({"show", "live-a"});
  EXPECT_EXIT_CODE(shown, 0);
  EXPECT_NE(shown.out.find("status:       ACTIVE"), std::string::npos) << shown.out;

  LeaseResult listed = Lease({"list"});
  EXPECT_EXIT_CODE(listed, 0);
  for (const char* name : {"live-a", "live-b"}) {
    EXPECT_NE(listed.out.find(name), std::string::npos) << listed.out;
  }

  // Blazar moves the end of an active lease when its host stays free.
  LeaseResult extended = Lease({"extend", "live-a", "--duration", "1h"});
  EXPECT_EXIT_CODE(extended, 0);
  EXPECT_GT(EndOf(extended.out), EndOf(shown.out)) << shown.out << extended.out;

  for (const char* name : {"live-a", "live-b"}) {
    LeaseResult deleted = Lease({"delete", name});
    EXPECT_EXIT_CODE(deleted, 0);
  }
  LeaseResult after = Lease({"list"});
  EXPECT_EQ(after.out.find("live-a"), std::string::npos) << after.out;
  LeaseResult gone = Lease({"show", "live-a"});
  EXPECT_EXIT_CODE(gone, 1);
  EXPECT_NE(gone.err.find("no lease named 'live-a'"), std::string::npos) << gone.err;
}

TEST_F(BlazarLiveTest, NoHostLeftAndARefusedExtendSayWhatBlazarSaid) {
  // Both gpu_a100_pcie hosts taken for an hour.
  for (const char* name : {"full-1", "full-2"}) {
    EXPECT_EXIT_CODE(Lease({"create", "--node-type", "gpu_a100_pcie", "--duration", "1h", "--name",
                            name, "--wait"}),
                     0);
  }
  LeaseResult refused =
      Lease({"create", "--node-type", "gpu_a100_pcie", "--duration", "1h", "--name", "full-3"});
  EXPECT_EXIT_CODE(refused, 1);
  EXPECT_NE(refused.err.find("no capacity for that period: 1 x node type gpu_a100_pcie"),
            std::string::npos)
      << refused.err;
  EXPECT_NE(refused.err.find("Not enough hosts available"), std::string::npos) << refused.err;

  // A lease of both hosts from 10 minutes after full-2 ends: full-1 cannot grow into it.
  LeaseResult shown = Lease({"show", "full-2"});
  EXPECT_EXIT_CODE(shown, 0);
  const std::string end = EndOf(shown.out);
  auto end_time = openstack::ParseUtcTimestamp(end);
  ASSERT_TRUE(end_time.ok()) << shown.out;
  EXPECT_EXIT_CODE(Lease({"create", "--node-type", "gpu_a100_pcie", "--start",
                          FormatUtc(*end_time + 10min, "%Y-%m-%d %H:%M"), "--duration", "2h",
                          "--hosts", "2", "--name", "later"}),
                   0);
  LeaseResult extend = Lease({"extend", "full-1", "--duration", "3h"});
  EXPECT_EXIT_CODE(extend, 1);
  EXPECT_NE(extend.err.find("no capacity to extend lease 'full-1'"), std::string::npos)
      << extend.err;
  EXPECT_NE(extend.err.find("Not enough hosts available"), std::string::npos) << extend.err;

  for (const char* name : {"full-1", "full-2", "later"}) {
    EXPECT_EXIT_CODE(Lease({"delete", name}), 0);
  }
}

// A KVM lease (flavor:instance, Blazar's flavor plugin): Blazar reads the flavor and its extra
// specs from Nova, counts the instances that fit each host's Placement inventory (48 VCPU, 192 GiB:
// one g1.h100.pci.1 of 16 VCPU and 128 GiB per host, three in all), then makes a private flavor, an
// aggregate and a resource class for the reservation, and at the start gives the project the
// flavor.
TEST_F(BlazarLiveTest, FlavorLeaseGoesFromPendingToActiveIsExtendedRefusedAndDeleted) {
  LeaseResult created = Lease({"create", "--flavor", "g1.h100.pci.1", "--name", "kvm-a"});
  EXPECT_EXIT_CODE(created, 0);
  EXPECT_TRUE(PendingOrStarting(created.out)) << created.out;
  // Blazar answers with its private flavor's id and the flavor asked for in resource_properties.
  EXPECT_NE(created.out.find("flavor:instance pending (1 x flavor f-h100-1)"), std::string::npos)
      << created.out;
  LeaseResult waited = Lease({"create", "--flavor", "g1.h100.pci.1", "--name", "kvm-b", "--wait"});
  EXPECT_EXIT_CODE(waited, 0);
  EXPECT_NE(waited.out.find("flavor:instance active"), std::string::npos) << waited.out;
  EXPECT_EXIT_CODE(Lease({"create", "--flavor", "g1.h100.pci.1", "--name", "kvm-c"}), 0);

  LeaseResult refused = Lease({"create", "--flavor", "g1.h100.pci.1", "--name", "kvm-d"});
  EXPECT_EXIT_CODE(refused, 1);
  EXPECT_NE(refused.err.find("no capacity for that period: 1 x flavor f-h100-1"), std::string::npos)
      << refused.err;
  EXPECT_NE(refused.err.find("Not enough hosts available"), std::string::npos) << refused.err;

  LeaseResult shown = Lease({"show", "kvm-a"});
  EXPECT_EXIT_CODE(shown, 0);
  EXPECT_NE(shown.out.find("status:       ACTIVE"), std::string::npos) << shown.out;
  // kvm-a's host stays free after it: Blazar moves its end.
  LeaseResult extended = Lease({"extend", "kvm-a", "--duration", "1h"});
  EXPECT_EXIT_CODE(extended, 0);
  EXPECT_GT(EndOf(extended.out), EndOf(shown.out)) << shown.out << extended.out;

  // From 10 minutes after kvm-b ends, two leases take the two hosts kvm-a does not hold: kvm-b
  // cannot grow into them.
  auto end_b = openstack::ParseUtcTimestamp(EndOf(Lease({"show", "kvm-b"}).out));
  ASSERT_TRUE(end_b.ok());
  for (const char* name : {"kvm-later-1", "kvm-later-2"}) {
    EXPECT_EXIT_CODE(
        Lease({"create", "--flavor", "g1.h100.pci.1", "--start",
               FormatUtc(*end_b + 10min, "%Y-%m-%d %H:%M"), "--duration", "2h", "--name", name}),
        0);
  }
  LeaseResult extend = Lease({"extend", "kvm-b", "--duration", "1h"});
  EXPECT_EXIT_CODE(extend, 1);
  EXPECT_NE(extend.err.find("no capacity to extend lease 'kvm-b'"), std::string::npos)
      << extend.err;
  EXPECT_NE(extend.err.find("Not enough hosts available"), std::string::npos) << extend.err;

  for (const char* name : {"kvm-a", "kvm-b", "kvm-c", "kvm-later-1", "kvm-later-2"}) {
    EXPECT_EXIT_CODE(Lease({"delete", name}), 0);
  }
  LeaseResult after = Lease({"list"});
  EXPECT_EQ(after.out.find("kvm-"), std::string::npos) << after.out;
}

// Blazar takes a PENDING lease's new end (its answer says UPDATING while the manager moves the
// end event) and deletes a PENDING lease outright.
TEST_F(BlazarLiveTest, APendingLeaseIsExtendedAndDeletedBeforeItStarts) {
  const std::string start = FormatUtc(std::chrono::system_clock::now() + 2h, "%Y-%m-%d %H:%M");
  LeaseResult created = Lease({"create", "--node-type", "gpu_a100_pcie", "--start", start,
                               "--duration", "1h", "--name", "ahead"});
  EXPECT_EXIT_CODE(created, 0);
  EXPECT_NE(created.out.find("status:       PENDING"), std::string::npos) << created.out;
  LeaseResult extended = Lease({"extend", "ahead", "--duration", "30m"});
  EXPECT_EXIT_CODE(extended, 0);
  auto start_time = openstack::ParseUtcTimestamp(start);
  ASSERT_TRUE(start_time.ok());
  EXPECT_EQ(EndOf(extended.out), FormatUtc(*start_time + 90min, "%Y-%m-%d %H:%M")) << extended.out;
  LeaseResult shown = Lease({"show", "ahead"});
  EXPECT_NE(shown.out.find("status:       PENDING"), std::string::npos) << shown.out;
  EXPECT_EQ(EndOf(shown.out), EndOf(extended.out)) << shown.out;

  EXPECT_EXIT_CODE(Lease({"delete", "ahead"}), 0);
  LeaseResult gone = Lease({"show", "ahead"});
  EXPECT_EXIT_CODE(gone, 1);
  EXPECT_NE(gone.err.find("no lease named 'ahead'"), std::string::npos) << gone.err;
}

// `llmctl submit --provision` of the current lab (experiments/single.yaml: target KVM@TACC,
// g1.h100.pci.1) reserves through Blazar and waits for the lease, saying each status Blazar
// answers; then a lease the user reserved ahead under the name submit uses, starting at the next
// minute, is found and waited for from PENDING. No agent image is given, so no node is brought
// up: `node up` says so, after the lease is ACTIVE.
TEST_F(BlazarLiveTest, SubmitProvisionReservesAndWaitsForTheLeaseToStart) {
  const std::string lease = "llmctl-single-h100-g1-h100-pci-1";
  CommandResult reserved = Llmctl("submit experiments/single.yaml --provision");
  EXPECT_NE(reserved.exit_code, 0) << reserved.out;  // no agent image: no node
  const size_t provisioning =
      reserved.out.find("provisioning lease " + lease + " and its node for target g1.h100.pci.1");
  const size_t pending = reserved.out.find("lease " + lease + " is PENDING; Blazar starts it at ");
  const size_t active = reserved.out.find("lease " + lease + " is ACTIVE\n");
  const size_t no_image = reserved.out.find("node up needs the agent's image");
  EXPECT_NE(provisioning, std::string::npos) << reserved.out;
  EXPECT_NE(pending, std::string::npos) << reserved.out;  // Blazar's answer to the create
  EXPECT_NE(active, std::string::npos) << reserved.out;
  EXPECT_NE(no_image, std::string::npos) << reserved.out;
  EXPECT_TRUE(provisioning < pending && pending < active && active < no_image) << reserved.out;
  LeaseResult shown = Lease({"show", lease});
  EXPECT_NE(shown.out.find("flavor:instance active (1 x flavor f-h100-1)"), std::string::npos)
      << shown.out;
  EXPECT_EXIT_CODE(Lease({"delete", lease}), 0);

  const std::string start = FormatUtc(NextMinute(), "%Y-%m-%d %H:%M");
  EXPECT_EXIT_CODE(Lease({"create", "--flavor", "g1.h100.pci.1", "--start", start, "--duration",
                          "1h", "--name", lease}),
                   0);
  CommandResult ahead = Llmctl("submit experiments/single.yaml --provision");
  EXPECT_NE(ahead.exit_code, 0) << ahead.out;
  const size_t waiting =
      ahead.out.find("lease " + lease + " is PENDING; Blazar starts it at " + start + " UTC\n");
  const size_t started = ahead.out.find("lease " + lease + " is ACTIVE\n");
  EXPECT_NE(waiting, std::string::npos) << ahead.out;
  EXPECT_NE(started, std::string::npos) << ahead.out;
  EXPECT_LT(waiting, started) << ahead.out;
  EXPECT_NE(ahead.out.find("node up needs the agent's image"), std::string::npos) << ahead.out;
  std::cout << "what submit --provision printed for a lease reserved ahead:\n" << ahead.out;

  EXPECT_EQ(Llmctl("daemon stop").exit_code, 0);
  EXPECT_EXIT_CODE(Lease({"delete", lease}), 0);
}

// Blazar makes a Keystone trust from the creator's token. Debian's Keystone carries the fix for
// application-credential trust escalation, which refuses trusts to every application credential's
// token, restricted or not ("Delegated tokens cannot manage trusts" in Blazar's log), and Blazar
// answers that with a bare 500.
TEST_F(BlazarLiveTest, AnApplicationCredentialThatKeystoneDeniesATrustGetsAHint) {
  LeaseResult refused =
      Lease({"create", "--node-type", "gpu_a100_pcie", "--duration", "1h", "--name", "by-app"},
            info_->ApplicationCredentialEnvironment());
  EXPECT_EXIT_CODE(refused, 1);
  EXPECT_NE(refused.err.find("HTTP 500"), std::string::npos) << refused.err;
  EXPECT_NE(refused.err.find("Internal Server Error"), std::string::npos) << refused.err;
  EXPECT_NE(refused.err.find("use a password or OIDC login"), std::string::npos) << refused.err;
  EXPECT_EQ(Lease({"list"}).out.find("by-app"), std::string::npos);
}

// blazar_server.py's API and manager threads share one SQLite file: two transactions that each
// read, then write, both commit (in CI, 11-29, a lease's start collided with another lease's create
// and SQLite failed it at once with "database is locked"; the lease went to ERROR).
TEST(BlazarServerTest, TwoThreadsThatReadThenWriteBothCommit) {
  std::string dir = (fs::temp_directory_path() / "llmctl-sqlite-XXXXXX").string();
  ASSERT_NE(mkdtemp(dir.data()), nullptr);
  CommandResult checked = RunShellCommand(
      "cd tests/blazar && ../../.venv-blazar/bin/python sqlite_transactions_check.py " + dir +
      " 2>&1");
  EXPECT_EQ(checked.exit_code, 0) << checked.out;
  EXPECT_NE(checked.out.find("2 of 2 read-then-write transactions committed, counter 2"),
            std::string::npos)
      << checked.out;
  fs::remove_all(dir);
}

}  // namespace
}  // namespace llmctl::testing
