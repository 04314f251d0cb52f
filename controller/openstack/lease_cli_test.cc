#include "controller/openstack/lease_cli.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <sstream>

#include "tests/openstack_sim/hostile_text.h"
#include "tests/openstack_sim/simulator.h"

namespace llmctl::openstack {
namespace {

using llmctl::testing::ExpectNoControlsFromTheCloud;
using llmctl::testing::kHostile;
using llmctl::testing::kHostileShown;
using llmctl::testing::Simulator;

class LeaseCliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto sim = Simulator::Start();
    ASSERT_TRUE(sim.ok()) << sim.status().ToString();
    sim_ = std::move(*sim);
  }

  struct Result {
    int code;
    std::string out, err;
  };

  Result Run(const std::vector<std::string>& args,
             const std::map<std::string, std::string>& env = {}) {
    LeaseCommandContext context;
    context.env = sim_->Environment(env);
    context.clock = &sim_->clock();
    context.http_options.sleep = [](std::chrono::milliseconds) {};
    std::ostringstream out, err;
    int code = RunLeaseCommand(args, out, err, context);
    return {code, out.str(), err.str()};
  }

  std::unique_ptr<Simulator> sim_;
};

TEST_F(LeaseCliTest, CreateAFlavorLeaseAndWait) {
  Result result = Run({"create", "--flavor", "g1.h100.pci.1", "--wait"});
  ASSERT_EQ(result.code, 0) << result.err;
  // What Blazar answered while the command waited, on stderr.
  EXPECT_EQ(result.err,
            "lease llmctl-g1.h100.pci.1-20300101-0000 is PENDING; Blazar starts it at "
            "2030-01-01 00:00 UTC\n"
            "lease llmctl-g1.h100.pci.1-20300101-0000 is ACTIVE\n");
  EXPECT_NE(result.out.find("name:         llmctl-g1.h100.pci.1-20300101-0000\n"),
            std::string::npos)
      << result.out;
  EXPECT_NE(result.out.find("status:       ACTIVE\n"), std::string::npos) << result.out;
  EXPECT_NE(result.out.find("start (UTC):  2030-01-01 00:00\nend (UTC):    2030-01-01 02:50\n"),
            std::string::npos)
      << result.out;
  EXPECT_NE(result.out.find("flavor:instance active (1 x flavor f-h100-1)"), std::string::npos);
}

TEST_F(LeaseCliTest, ListShowExtendDelete) {
  ASSERT_EQ(Run({"create", "--node-type", "gpu_a100_pcie", "--site", "KVM@TACC", "--name", "bm",
                 "--duration", "1h", "--start", "2030-01-01 06:00"})
                .code,
            0);
  Result list = Run({"list"});
  ASSERT_EQ(list.code, 0) << list.err;
  std::istringstream lines(list.out);
  std::string header, row;
  std::getline(lines, header);
  std::getline(lines, row);
  EXPECT_TRUE(header.starts_with("NAME  STATUS   START (UTC)       END (UTC)         RESERVES"))
      << header;
  EXPECT_TRUE(
      row.starts_with("bm    PENDING  2030-01-01 06:00  2030-01-01 07:00  1 x "
                      "physical:host"))
      << row;

  Result extend = Run({"extend", "bm", "--duration", "30m"});
  ASSERT_EQ(extend.code, 0) << extend.err;
  EXPECT_NE(extend.out.find("end (UTC):    2030-01-01 07:30"), std::string::npos) << extend.out;
  Result show = Run({"show", "bm"});
  EXPECT_NE(show.out.find("end (UTC):    2030-01-01 07:30"), std::string::npos) << show.out;

  Result removed = Run({"delete", "bm"});
  ASSERT_EQ(removed.code, 0) << removed.err;
  EXPECT_EQ(removed.out, "deleted lease bm\n");
  EXPECT_EQ((*sim_->Books())["leases"], nlohmann::json::array());
  Result again = Run({"delete", "bm"});
  EXPECT_EQ(again.code, 1);
  EXPECT_EQ(again.err, "llmctl lease delete: no lease named 'bm'\n");
}

// A lease reserved ahead: show --wait sleeps to its start and prints it once ACTIVE.
TEST_F(LeaseCliTest, ShowWaitsForALeaseReservedAhead) {
  ASSERT_EQ(Run({"create", "--node-type", "gpu_a100_pcie", "--site", "KVM@TACC", "--name", "ahead",
                 "--start", "2030-01-01 06:00"})
                .code,
            0);
  Result shown = Run({"show", "ahead", "--wait"});
  ASSERT_EQ(shown.code, 0) << shown.err;
  EXPECT_EQ(shown.err,
            "lease ahead is PENDING; Blazar starts it at 2030-01-01 06:00 UTC\n"
            "lease ahead is ACTIVE\n");
  EXPECT_NE(shown.out.find("status:       ACTIVE\n"), std::string::npos) << shown.out;
  EXPECT_GE(sim_->clock().Now(), *ParseUtcTimestamp("2030-01-01 06:00"));
  // Without --wait, show only shows.
  EXPECT_EQ(Run({"show", "ahead"}).err, "");
}

TEST_F(LeaseCliTest, RerunningTheSameCreateMakesNoSecondLease) {
  ASSERT_EQ(Run({"create", "--flavor", "g1.h100.pci.1"}).code, 0);
  Result again = Run({"create", "--flavor", "g1.h100.pci.1"});
  EXPECT_EQ(again.code, 1);
  EXPECT_NE(again.err.find("a lease named 'llmctl-g1.h100.pci.1-20300101-0000' already exists"),
            std::string::npos)
      << again.err;
  EXPECT_EQ((*sim_->Books())["leases"].size(), 1u);
}

TEST_F(LeaseCliTest, BadInputIsUsageErrorNamingTheFlag) {
  Result duration = Run({"create", "--flavor", "g1.h100.pci.1", "--duration", "2x"});
  EXPECT_EQ(duration.code, 2);
  EXPECT_EQ(duration.err,
            "llmctl lease create: duration '2x' is not like 2h50m (units d, h, m, s)\n");
  Result neither = Run({"create"});
  EXPECT_EQ(neither.code, 2);
  EXPECT_NE(neither.err.find("exactly one of --flavor"), std::string::npos);
  Result past = Run({"create", "--flavor", "g1.h100.pci.1", "--start", "2029-12-31 10:00"});
  EXPECT_EQ(past.code, 2);
  EXPECT_NE(past.err.find("is in the past"), std::string::npos) << past.err;
  Result unknown = Run({"frobnicate"});
  EXPECT_EQ(unknown.code, 2);
  EXPECT_EQ(sim_->CountRequests("POST", "/blazar"), 0);
}

TEST_F(LeaseCliTest, UnknownFlavorSuggestsTheNearestOne) {
  Result result = Run({"create", "--flavor", "g1.h100.pci.2"});
  EXPECT_EQ(result.code, 1);
  EXPECT_NE(result.err.find("no flavor 'g1.h100.pci.2' at this site (did you mean "
                            "'g1.h100.pci.1'?)"),
            std::string::npos)
      << result.err;
}

TEST_F(LeaseCliTest, ASiteTheCredentialsCannotReachIsRefusedBeforeAnyCall) {
  // The simulator is not a Chameleon site, so its credentials cannot be moved to CHI@UC.
  Result result = Run({"create", "--node-type", "gpu_a100_pcie", "--site", "CHI@UC"});
  EXPECT_EQ(result.code, 1);
  EXPECT_NE(result.err.find("--site CHI@UC is at CHI@UC, but the credentials (OS_* variables) are "
                            "for region KVM@TACC"),
            std::string::npos)
      << result.err;
  EXPECT_EQ(sim_->CountRequests("POST", "/v3"), 0);
}

TEST_F(LeaseCliTest, AnotherChameleonSiteNeedsItsOwnApplicationCredential) {
  // Credentials for CHI@UC's Keystone; g1.* flavors live at KVM@TACC. Nothing is sent anywhere.
  Result result = Run(
      {"create", "--flavor", "g1.h100.pci.1"},
      {{"OS_AUTH_URL", "https://chi.uc.chameleoncloud.org:5000/v3"}, {"OS_REGION_NAME", "CHI@UC"}});
  EXPECT_EQ(result.code, 1);
  EXPECT_EQ(result.err,
            "llmctl lease create: flavor g1.h100.pci.1 is at KVM@TACC, but the credentials (OS_* "
            "variables) are for CHI@UC; application credentials and passwords belong to one site: "
            "use KVM@TACC's (its openrc file or a clouds.yaml entry with --os-cloud)\n");
}

TEST_F(LeaseCliTest, NoSecretInAnyOutput) {
  const std::string secret = "cli-Secret-42";
  Result result = Run({"list"}, {{"OS_APPLICATION_CREDENTIAL_SECRET", secret}});
  EXPECT_EQ(result.code, 1);
  EXPECT_NE(result.err.find("HTTP 401"), std::string::npos) << result.err;
  EXPECT_EQ(result.err.find(secret), std::string::npos) << result.err;
  EXPECT_EQ(result.out.find(secret), std::string::npos);
}

TEST_F(LeaseCliTest, ALeaseNameOrStatusFromTheCloudReachesNoTerminalRaw) {
  Result created = Run({"create", "--flavor", "g1.h100.pci.1", "--name", kHostile, "--wait"});
  ASSERT_EQ(created.code, 0) << created.err;
  ExpectNoControlsFromTheCloud(created.out);
  ExpectNoControlsFromTheCloud(created.err);
  EXPECT_NE(created.out.find(std::string("name:         ").append(kHostileShown).append("\n")),
            std::string::npos)
      << created.out;
  // --wait's progress on stderr: one line per status Blazar answered.
  EXPECT_EQ(created.err, std::string("lease ")
                             .append(kHostileShown)
                             .append(" is PENDING; Blazar starts it at 2030-01-01 00:00 UTC\n")
                             .append("lease ")
                             .append(kHostileShown)
                             .append(" is ACTIVE\n"));

  // Blazar's status is the cloud's text too.
  ASSERT_TRUE(
      sim_->Admin("lease_status", {{"name", kHostile}, {"status", "ACTIVE\x1b[2J\nok"}}).ok());
  Result list = Run({"list"});
  ASSERT_EQ(list.code, 0) << list.err;
  ExpectNoControlsFromTheCloud(list.out);
  // The header and one row, nothing a newline of the cloud's added.
  EXPECT_EQ(std::count(list.out.begin(), list.out.end(), '\n'), 2) << list.out;
  EXPECT_NE(list.out.find(std::string(kHostileShown).append("  ACTIVE [2J ok  ")),
            std::string::npos)
      << list.out;
  Result show = Run({"show", kHostile});
  ASSERT_EQ(show.code, 0) << show.err;
  ExpectNoControlsFromTheCloud(show.out);
  EXPECT_NE(show.out.find("status:       ACTIVE [2J ok\n"), std::string::npos) << show.out;
  EXPECT_NE(show.out.find("reservation:  "), std::string::npos) << show.out;
}

// A lease's name is anyone's in the project, of any length: cut in the table and in show, so that
// one 5,000-byte name does not make every row of `lease list` that wide.
TEST_F(LeaseCliTest, ALongLeaseNameIsCut) {
  const std::string name = std::string(5000, 'n').append("\xe2\x80\xae");
  ASSERT_EQ(Run({"create", "--flavor", "g1.h100.pci.1", "--name", name}).code, 0);
  ASSERT_EQ(Run({"create", "--flavor", "g1.h100.pci.1", "--name", "short"}).code, 0);
  Result list = Run({"list"});
  ASSERT_EQ(list.code, 0) << list.err;
  EXPECT_EQ(std::count(list.out.begin(), list.out.end(), '\n'), 3) << list.out;
  size_t start = 0;
  for (size_t end = list.out.find('\n'); end != std::string::npos;
       start = end + 1, end = list.out.find('\n', start)) {
    EXPECT_LT(end - start, 400u) << list.out.substr(start, end - start);
  }
  EXPECT_NE(list.out.find(std::string(100, 'n').append("\u2026")), std::string::npos) << list.out;
  Result show = Run({"show", name});
  ASSERT_EQ(show.code, 0) << show.err;
  EXPECT_LT(show.out.size(), 2000u) << show.out;
  EXPECT_EQ(show.out.find("\xe2\x80\xae"), std::string::npos);
}

// --wait's progress quotes the lease's name and Blazar's status: each line is cut like a lease's
// own lines in show.
TEST_F(LeaseCliTest, ALongLeaseNameIsCutInWaitsProgress) {
  const std::string name = std::string(5000, 'n');
  Result created = Run({"create", "--flavor", "g1.h100.pci.1", "--name", name, "--wait"});
  ASSERT_EQ(created.code, 0) << created.err;
  EXPECT_EQ(std::count(created.err.begin(), created.err.end(), '\n'), 2) << created.err;
  size_t start = 0;
  for (size_t end = created.err.find('\n'); end != std::string::npos;
       start = end + 1, end = created.err.find('\n', start)) {
    const std::string line = created.err.substr(start, end - start);
    EXPECT_LE(line.size(), 1024u) << line.substr(0, 100);
    EXPECT_TRUE(line.ends_with("n\u2026")) << line.substr(0, 100);
  }
}

// An error quoting the cloud's words is printed on its one line of stderr, without their
// controls.
TEST_F(LeaseCliTest, AnErrorQuotingTheCloudIsOneLineWithoutItsControls) {
  ASSERT_EQ(Run({"create", "--node-type", "gpu_a100_pcie", "--site", "KVM@TACC", "--name", kHostile,
                 "--start", "2030-01-01 06:00"})
                .code,
            0);
  ASSERT_TRUE(sim_->Admin("fail_lease", {{"name", kHostile}}).ok());
  Result shown = Run({"show", kHostile, "--wait"});
  EXPECT_EQ(shown.code, 1) << shown.err;
  ExpectNoControlsFromTheCloud(shown.err);
  // PENDING, ERROR, then the error: three lines.
  EXPECT_EQ(std::count(shown.err.begin(), shown.err.end(), '\n'), 3) << shown.err;
  EXPECT_NE(
      shown.err.find(std::string("llmctl lease show: lease '").append(kHostileShown).append("' (")),
      std::string::npos)
      << shown.err;
  EXPECT_TRUE(
      shown.err.ends_with("went to ERROR: Blazar could not start it; delete it and try "
                          "another period or site\n"))
      << shown.err;
}

TEST(ParseDurationTest, UnitsAndErrors) {
  EXPECT_EQ(*ParseDuration("2h50m"), std::chrono::seconds(10200));
  EXPECT_EQ(*ParseDuration("1d12h"), std::chrono::seconds(129600));
  EXPECT_EQ(*ParseDuration("45s"), std::chrono::seconds(45));
  for (const char* bad : {"", "2", "h", "2h50", "-1h", "0m", "1w"}) {
    EXPECT_FALSE(ParseDuration(bad).ok()) << bad;
  }
}

// 999999d, 2700 years, overflowed a start time's nanoseconds; a year is the most taken.
TEST(ParseDurationTest, AtMostAYear) {
  EXPECT_EQ(*ParseDuration("365d"), kMaxLeaseDuration);
  EXPECT_EQ(*ParseDuration("364d23h59m60s"), kMaxLeaseDuration);
  for (const char* long_ones : {"365d1s", "999999d", "366d", "8761h", "525601m"}) {
    StatusOr<std::chrono::seconds> parsed = ParseDuration(long_ones);
    ASSERT_FALSE(parsed.ok()) << long_ones;
    EXPECT_EQ(parsed.status().code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(parsed.status().message(),
              std::string("duration '")
                  .append(long_ones)
                  .append("' is longer than 365d, the longest lease llmctl asks Blazar for"));
  }
  // However many terms: the sum is checked after each.
  std::string many;
  for (int i = 0; i < 2000; ++i) many += "999999d";
  EXPECT_EQ(ParseDuration(many).status().code(), StatusCode::kInvalidArgument);
}

TEST_F(LeaseCliTest, ATooLongDurationIsUsageErrorBeforeAnythingIsSent) {
  Result created = Run({"create", "--flavor", "g1.h100.pci.1", "--duration", "999999d"});
  EXPECT_EQ(created.code, 2);
  EXPECT_EQ(created.err,
            "llmctl lease create: duration '999999d' is longer than 365d, the longest lease "
            "llmctl asks Blazar for\n");
  EXPECT_EQ(sim_->CountRequests("POST", "/blazar"), 0);

  ASSERT_EQ(Run({"create", "--flavor", "g1.h100.pci.1", "--name", "l"}).code, 0);
  Result extended = Run({"extend", "l", "--duration", "999999d"});
  EXPECT_EQ(extended.code, 2);
  EXPECT_NE(extended.err.find("duration '999999d' is longer than 365d"), std::string::npos)
      << extended.err;
}

// A start late in kMaxUtcYear plus a duration: the lease would end in a year whose dates llmctl
// does not read back, so it is not made (nor extended there).
TEST_F(LeaseCliTest, ALeaseEndingAfterTheLastReadableYearIsRefused) {
  Result late = Run(
      {"create", "--flavor", "g1.h100.pci.1", "--start", "2199-12-31 12:00", "--duration", "365d"});
  EXPECT_EQ(late.code, 2);
  EXPECT_EQ(late.err,
            "llmctl lease create: --start 2199-12-31 12:00 plus --duration 365d ends after 2199, "
            "the last year llmctl reads a lease's dates in\n");
  EXPECT_EQ(sim_->CountRequests("POST", "/blazar"), 0);
  // Ending within 2199 is fine.
  Result last = Run({"create", "--flavor", "g1.h100.pci.1", "--name", "last", "--start",
                     "2199-12-31 12:00", "--duration", "11h59m"});
  ASSERT_EQ(last.code, 0) << last.err;
  EXPECT_NE(last.out.find("end (UTC):    2199-12-31 23:59\n"), std::string::npos) << last.out;
  Result extended = Run({"extend", "last", "--duration", "1m"});
  EXPECT_EQ(extended.code, 2);
  EXPECT_EQ(extended.err,
            "llmctl lease extend: lease 'last' extended by --duration 1m ends after 2199, the last "
            "year llmctl reads a lease's dates in\n");
}

// Blazar's API takes JSON text, which must be UTF-8: a name that is not (a Latin-1 terminal's
// "café") is the caller's mistake, refused before anything is sent.
TEST_F(LeaseCliTest, ALeaseNameThatIsNotUtf8IsRefusedBeforeAnythingIsSent) {
  Result created = Run({"create", "--flavor", "g1.h100.pci.1", "--name", "caf\xe9"});
  EXPECT_EQ(created.code, 2) << created.err;
  EXPECT_NE(created.err.find("--name"), std::string::npos) << created.err;
  EXPECT_NE(created.err.find("UTF-8"), std::string::npos) << created.err;
  EXPECT_EQ(created.err.find('\xe9'), std::string::npos) << created.err;
  EXPECT_TRUE(Run({"list"}).out.find("caf") == std::string::npos);
}

}  // namespace
}  // namespace llmctl::openstack
