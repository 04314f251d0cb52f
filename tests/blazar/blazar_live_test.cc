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

#include "controller/openstack/cloud_clock.h"
#include "controller/openstack/lease_cli.h"
#include "tests/keystone/local_keystone.h"
#include "tests/openstack_sim/simulator.h"
#include "tests/support/local_script.h"

namespace llmctl::testing {
namespace {

using openstack::FormatUtc;
using openstack::LeaseCommandContext;
using openstack::RunLeaseCommand;
using openstack::TimePoint;
using namespace std::chrono_literals;

constexpr auto kStartTimeout = 240s;

struct CommandResult {
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
            {"--auth-url", info.auth_url, "--admin-password", info.admin_password, "--region",
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
  static CommandResult Lease(
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
    CommandResult result;
    result.exit_code = RunLeaseCommand(args, out, err, context);
    result.out = out.str();
    result.err = err.str();
    return result;
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
  CommandResult created =
      Lease({"create", "--node-type", "gpu_a100_pcie", "--duration", "1h", "--name", "live-a"});
  EXPECT_EXIT_CODE(created, 0);
  // Blazar answers the POST before its manager starts the lease.
  EXPECT_NE(created.out.find("status:       PENDING"), std::string::npos) << created.out;
  EXPECT_NE(created.out.find("physical:host pending (1 x [\"==\", \"$node_type\", "
                             "\"gpu_a100_pcie\"])"),
            std::string::npos)
      << created.out;

  CommandResult waited = Lease(
      {"create", "--node-type", "gpu_a100_pcie", "--duration", "1h", "--name", "live-b", "--wait"});
  EXPECT_EXIT_CODE(waited, 0);
  EXPECT_NE(waited.out.find("status:       ACTIVE"), std::string::npos) << waited.out;
  EXPECT_NE(waited.out.find("physical:host active"), std::string::npos) << waited.out;

  CommandResult shown = Lease({"show", "live-a"});
  EXPECT_EXIT_CODE(shown, 0);
  EXPECT_NE(shown.out.find("status:       ACTIVE"), std::string::npos) << shown.out;

  CommandResult listed = Lease({"list"});
  EXPECT_EXIT_CODE(listed, 0);
  for (const char* name : {"live-a", "live-b"}) {
    EXPECT_NE(listed.out.find(name), std::string::npos) << listed.out;
  }

  // Blazar moves the end of an active lease when its host stays free.
  CommandResult extended = Lease({"extend", "live-a", "--duration", "1h"});
  EXPECT_EXIT_CODE(extended, 0);
  EXPECT_GT(EndOf(extended.out), EndOf(shown.out)) << shown.out << extended.out;

  for (const char* name : {"live-a", "live-b"}) {
    CommandResult deleted = Lease({"delete", name});
    EXPECT_EXIT_CODE(deleted, 0);
  }
  CommandResult after = Lease({"list"});
  EXPECT_EQ(after.out.find("live-a"), std::string::npos) << after.out;
  CommandResult gone = Lease({"show", "live-a"});
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
  CommandResult refused =
      Lease({"create", "--node-type", "gpu_a100_pcie", "--duration", "1h", "--name", "full-3"});
  EXPECT_EXIT_CODE(refused, 1);
  EXPECT_NE(refused.err.find("no capacity for that period: 1 x node type gpu_a100_pcie"),
            std::string::npos)
      << refused.err;
  EXPECT_NE(refused.err.find("Not enough hosts available"), std::string::npos) << refused.err;

  // A lease of both hosts from 10 minutes after full-2 ends: full-1 cannot grow into it.
  CommandResult shown = Lease({"show", "full-2"});
  EXPECT_EXIT_CODE(shown, 0);
  const std::string end = EndOf(shown.out);
  auto end_time = openstack::ParseUtcTimestamp(end);
  ASSERT_TRUE(end_time.ok()) << shown.out;
  EXPECT_EXIT_CODE(Lease({"create", "--node-type", "gpu_a100_pcie", "--start",
                          FormatUtc(*end_time + 10min, "%Y-%m-%d %H:%M"), "--duration", "2h",
                          "--hosts", "2", "--name", "later"}),
                   0);
  CommandResult extend = Lease({"extend", "full-1", "--duration", "3h"});
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
  CommandResult created = Lease({"create", "--flavor", "g1.h100.pci.1", "--name", "kvm-a"});
  EXPECT_EXIT_CODE(created, 0);
  EXPECT_NE(created.out.find("status:       PENDING"), std::string::npos) << created.out;
  // Blazar answers with its private flavor's id and the flavor asked for in resource_properties.
  EXPECT_NE(created.out.find("flavor:instance pending (1 x flavor f-h100-1)"), std::string::npos)
      << created.out;
  CommandResult waited =
      Lease({"create", "--flavor", "g1.h100.pci.1", "--name", "kvm-b", "--wait"});
  EXPECT_EXIT_CODE(waited, 0);
  EXPECT_NE(waited.out.find("flavor:instance active"), std::string::npos) << waited.out;
  EXPECT_EXIT_CODE(Lease({"create", "--flavor", "g1.h100.pci.1", "--name", "kvm-c"}), 0);

  CommandResult refused = Lease({"create", "--flavor", "g1.h100.pci.1", "--name", "kvm-d"});
  EXPECT_EXIT_CODE(refused, 1);
  EXPECT_NE(refused.err.find("no capacity for that period: 1 x flavor f-h100-1"), std::string::npos)
      << refused.err;
  EXPECT_NE(refused.err.find("Not enough hosts available"), std::string::npos) << refused.err;

  CommandResult shown = Lease({"show", "kvm-a"});
  EXPECT_EXIT_CODE(shown, 0);
  EXPECT_NE(shown.out.find("status:       ACTIVE"), std::string::npos) << shown.out;
  // kvm-a's host stays free after it: Blazar moves its end.
  CommandResult extended = Lease({"extend", "kvm-a", "--duration", "1h"});
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
  CommandResult extend = Lease({"extend", "kvm-b", "--duration", "1h"});
  EXPECT_EXIT_CODE(extend, 1);
  EXPECT_NE(extend.err.find("no capacity to extend lease 'kvm-b'"), std::string::npos)
      << extend.err;
  EXPECT_NE(extend.err.find("Not enough hosts available"), std::string::npos) << extend.err;

  for (const char* name : {"kvm-a", "kvm-b", "kvm-c", "kvm-later-1", "kvm-later-2"}) {
    EXPECT_EXIT_CODE(Lease({"delete", name}), 0);
  }
  CommandResult after = Lease({"list"});
  EXPECT_EQ(after.out.find("kvm-"), std::string::npos) << after.out;
}

// Blazar makes a Keystone trust from the creator's token. Debian's Keystone carries the fix for
// application-credential trust escalation, which refuses trusts to every application credential's
// token, restricted or not ("Delegated tokens cannot manage trusts" in Blazar's log), and Blazar
// answers that with a bare 500.
TEST_F(BlazarLiveTest, AnApplicationCredentialThatKeystoneDeniesATrustGetsAHint) {
  CommandResult refused =
      Lease({"create", "--node-type", "gpu_a100_pcie", "--duration", "1h", "--name", "by-app"},
            info_->ApplicationCredentialEnvironment());
  EXPECT_EXIT_CODE(refused, 1);
  EXPECT_NE(refused.err.find("HTTP 500"), std::string::npos) << refused.err;
  EXPECT_NE(refused.err.find("Internal Server Error"), std::string::npos) << refused.err;
  EXPECT_NE(refused.err.find("use a password or OIDC login"), std::string::npos) << refused.err;
  EXPECT_EQ(Lease({"list"}).out.find("by-app"), std::string::npos);
}

}  // namespace
}  // namespace llmctl::testing
