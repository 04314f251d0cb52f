#include "controller/openstack/blazar.h"

#include <gtest/gtest.h>

#include <memory>

#include "common/utc_time.h"
#include "controller/openstack/nova.h"
#include "tests/openstack_sim/simulator.h"

namespace llmctl::openstack {
namespace {

using llmctl::testing::Simulator;
using nlohmann::json;
using std::chrono::hours;
using std::chrono::minutes;
using std::chrono::seconds;

class BlazarTest : public ::testing::Test {
 protected:
  void SetUp() override { StartSimulator({}); }

  void StartSimulator(const std::vector<std::string>& args) {
    auto sim = Simulator::Start(args);
    ASSERT_TRUE(sim.ok()) << sim.status().ToString();
    sim_ = std::move(*sim);
    http::ClientOptions http_options;
    http_options.sleep = [this](std::chrono::milliseconds) { ++http_retry_sleeps_; };
    http_ = std::make_unique<http::HttpClient>(http_options);
    Connect("ac-unrestricted");
  }

  void Connect(const std::string& credential_id,
               std::chrono::milliseconds request_timeout = std::chrono::seconds(10)) {
    auto creds = CredentialsFromEnvironment(
        sim_->Environment({{"OS_APPLICATION_CREDENTIAL_ID", credential_id}}));
    ASSERT_TRUE(creds.ok()) << creds.status().ToString();
    SessionOptions options;
    options.request_timeout = request_timeout;
    session_ = std::make_unique<Session>(*creds, *http_, sim_->clock(), options);
    blazar_ = std::make_unique<BlazarClient>(*session_, sim_->clock());
  }

  LeaseSpec FlavorLease(const std::string& name, const std::string& flavor_id = "f-h100-1") {
    LeaseSpec spec;
    spec.name = name;
    spec.end = sim_->clock().Now() + hours(2) + minutes(50);
    spec.flavor_id = flavor_id;
    return spec;
  }

  LeaseSpec HostLease(const std::string& name, int hosts) {
    LeaseSpec spec;
    spec.name = name;
    spec.end = sim_->clock().Now() + hours(2) + minutes(50);
    spec.node_type = "gpu_a100_pcie";
    spec.hosts = hosts;
    return spec;
  }

  // Names of the leases the simulator holds, whatever their state.
  std::vector<std::string> LeasesInBooks() {
    std::vector<std::string> names;
    auto books = sim_->Books();
    if (books.ok()) {
      for (const json& lease : (*books)["leases"]) names.push_back(lease["name"]);
    }
    return names;
  }

  std::unique_ptr<Simulator> sim_;
  int http_retry_sleeps_ = 0;
  std::unique_ptr<http::HttpClient> http_;
  std::unique_ptr<Session> session_;
  std::unique_ptr<BlazarClient> blazar_;
};

TEST(LeaseRequestBodyTest, MatchesPythonChisShapes) {
  LeaseSpec flavor;
  flavor.name = "my-lease";
  flavor.end = *ParseUtcTimestamp("2025-08-13 14:00");
  flavor.flavor_id = "f-1";
  EXPECT_EQ(LeaseRequestBody(flavor), json::parse(R"({
    "name": "my-lease", "start_date": "now", "end_date": "2025-08-13 14:00",
    "events": [], "before_end_date": null,
    "reservations": [{"resource_type": "flavor:instance", "flavor_id": "f-1", "amount": 1,
                      "affinity": null}]})"));
  LeaseSpec host;
  host.name = "bm";
  host.start = *ParseUtcTimestamp("2025-08-13 10:05");
  host.end = *ParseUtcTimestamp("2025-08-13 14:00");
  host.node_type = "gpu_a100_pcie";
  host.hosts = 2;
  EXPECT_EQ(LeaseRequestBody(host)["start_date"], "2025-08-13 10:05");
  EXPECT_EQ(LeaseRequestBody(host)["reservations"][0], json::parse(R"({
    "resource_type": "physical:host",
    "resource_properties": "[\"==\", \"$node_type\", \"gpu_a100_pcie\"]",
    "hypervisor_properties": "", "min": 2, "max": 2})"));
}

TEST(ParseLeaseTest, AcceptsReservationsAsAJsonString) {
  auto lease = ParseLease(json::parse(R"({"id": "l1", "name": "n", "status": "PENDING",
    "start_date": "2017-12-26T12:00:00.000000", "end_date": "2017-12-27T12:00:00.000000",
    "reservations": "[{\"id\": \"r1\", \"resource_type\": \"physical:host\", \"min\": 4}]"})"));
  ASSERT_TRUE(lease.ok()) << lease.status().ToString();
  ASSERT_EQ(lease->reservations.size(), 1u);
  EXPECT_EQ(lease->reservations[0].min, 4);
  EXPECT_EQ(FormatUtc(lease->end, "%Y-%m-%d %H:%M"), "2017-12-27 12:00");
  EXPECT_FALSE(ParseLease(json::parse(R"({"id": "l1", "start_date": "soon"})")).ok());
}

// strptime reads years 0-9999, but a TimePoint's nanoseconds hold only 1677-2262: a far date
// overflowed (undefined behaviour) instead of being refused.
TEST(ParseUtcTimestampTest, RefusesYearsATimePointCannotHoldWithRoomToAdd) {
  for (const char* text : {"9999-12-31T23:59:59Z", "2262-04-12 00:00", "2200-01-01T00:00:00Z",
                           "1677-09-21 00:00", "0000-01-01 00:00", "1899-12-31T23:59:59Z"}) {
    auto time = ParseUtcTimestamp(text);
    ASSERT_FALSE(time.ok()) << text;
    EXPECT_EQ(time.status().code(), StatusCode::kInvalidArgument);
    EXPECT_TRUE(time.status().message().starts_with(std::string("'").append(text).append("'")))
        << time.status().message();
  }
  auto last = ParseUtcTimestamp("2199-12-31T23:59:59.999999Z");
  ASSERT_TRUE(last.ok()) << last.status().ToString();
  EXPECT_EQ(FormatUtc(*last, "%Y-%m-%dT%H:%M:%SZ"), "2199-12-31T23:59:59Z");
  auto first = ParseUtcTimestamp("1900-01-01 00:00");
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  EXPECT_EQ(FormatUtc(*first, "%Y-%m-%d %H:%M"), "1900-01-01 00:00");
  auto lease = ParseLease(json::parse(R"({"id": "l1", "start_date": "2030-01-01 00:00",
    "end_date": "9999-12-31 23:59"})"));
  ASSERT_FALSE(lease.ok());
  EXPECT_EQ(lease.status().code(), StatusCode::kInternal);
  EXPECT_NE(lease.status().message().find("9999-12-31 23:59"), std::string::npos);
}

// strptime checks each field alone and timegm rolls over what is past its end: a date that does
// not exist was read as another one.
TEST(ParseUtcTimestampTest, RefusesDatesThatDoNotExist) {
  for (const char* text : {"2030-02-31 00:00", "2031-02-29T00:00:00Z", "2030-04-31 12:00",
                           "2030-01-01T23:59:60Z", "2030-12-31 23:59:61"}) {
    auto time = ParseUtcTimestamp(text);
    ASSERT_FALSE(time.ok()) << text << " read as " << FormatUtc(*time, "%Y-%m-%d %H:%M:%S");
    EXPECT_EQ(time.status().code(), StatusCode::kInvalidArgument);
    EXPECT_TRUE(time.status().message().starts_with(std::string("'").append(text).append("'")));
  }
  auto leap = ParseUtcTimestamp("2032-02-29 23:59");
  ASSERT_TRUE(leap.ok()) << leap.status().ToString();
  EXPECT_EQ(FormatUtc(*leap, "%Y-%m-%d %H:%M"), "2032-02-29 23:59");
}

// libstdc++'s regex recursed once per letter of the message: a 500 whose message was "Not enough "
// and 100,000 letters overflowed the stack of `llmctl lease create`.
TEST(NoCapacityAnswerTest, ALongMessageIsReadWithoutOverflowingTheStack) {
  http::Response response;
  response.status = 500;
  response.body =
      json({{"error_message", "Not enough " + std::string(1 << 20, 'a') + " available"}}).dump();
  EXPECT_FALSE(IsNoCapacityAnswer(response));
  response.body = R"({"error_code": 500, "error_message": "Not enough hosts available"})";
  EXPECT_TRUE(IsNoCapacityAnswer(response));
  response.status = 409;
  EXPECT_FALSE(IsNoCapacityAnswer(response));
}

TEST_F(BlazarTest, FlavorLeaseLifecycleOnTheSimulatorsClock) {
  NovaClient nova(*session_, sim_->clock());
  auto flavor = nova.FindFlavor("g1.h100.pci.1");
  ASSERT_TRUE(flavor.ok()) << flavor.status().ToString();
  auto created = blazar_->Create(FlavorLease("life", flavor->id));
  ASSERT_TRUE(created.ok()) << created.status().ToString();
  EXPECT_EQ(created->status, "PENDING");
  ASSERT_EQ(created->reservations.size(), 1u);
  const std::string reservation_id = created->reservations[0].id;
  EXPECT_EQ(nova.ReservationFlavor(reservation_id).status().code(), StatusCode::kNotFound);

  auto active = blazar_->WaitUntilActive("life", seconds(300));
  ASSERT_TRUE(active.ok()) << active.status().ToString();
  EXPECT_EQ(active->status, "ACTIVE");
  EXPECT_EQ(sim_->clock().sleeps(), 1);  // one 5 s poll
  auto private_flavor = nova.ReservationFlavor(reservation_id);
  ASSERT_TRUE(private_flavor.ok()) << private_flavor.status().ToString();
  EXPECT_EQ(private_flavor->name, "reservation:" + reservation_id);

  sim_->clock().SleepFor(hours(3));
  auto ended = blazar_->Get("life");
  ASSERT_TRUE(ended.ok());
  EXPECT_EQ(ended->status, "TERMINATED");
  EXPECT_EQ((*sim_->Books())["private_flavors"], json::array());
  ASSERT_TRUE(blazar_->Delete("life").ok());
  EXPECT_TRUE(LeasesInBooks().empty());
}

TEST_F(BlazarTest, WaitCoversALeaseThatStartsLater) {
  LeaseSpec spec = HostLease("later", 1);
  spec.start = sim_->clock().Now() + hours(1);
  spec.end = *spec.start + hours(2);
  ASSERT_TRUE(blazar_->Create(spec).ok());
  std::vector<std::string> said;
  auto active = blazar_->WaitUntilActive(
      "later", seconds(60), [&said](const std::string& line) { said.push_back(line); });
  ASSERT_TRUE(active.ok()) << active.status().ToString();
  EXPECT_GE(sim_->clock().Now(), *spec.start);
  // To the start a minute at a time, then at most one poll.
  EXPECT_LE(sim_->clock().sleeps(), 61);
  // Each status once, as Blazar answered it, however many polls saw it.
  EXPECT_EQ(said, (std::vector<std::string>{
                      "lease later is PENDING; Blazar starts it at 2030-01-01 01:00 UTC",
                      "lease later is ACTIVE"}));
}

// The simulator's clock, with a wall clock `before` off it until the first sleep and `after` off it
// from then on: chrony stepping a node's clock during a wait.
class SteppedWallClock : public CloudClock {
 public:
  SteppedWallClock(CloudClock& cloud, std::chrono::system_clock::duration before,
                   std::chrono::system_clock::duration after)
      : cloud_(cloud), offset_(before), after_(after) {}
  TimePoint Now() const override { return cloud_.Now() + offset_; }
  std::chrono::milliseconds SinceBoot() const override { return cloud_.SinceBoot(); }
  void SleepFor(std::chrono::milliseconds duration) override {
    cloud_.SleepFor(duration);
    offset_ = after_;
  }

 private:
  CloudClock& cloud_;
  std::chrono::system_clock::duration offset_;
  std::chrono::system_clock::duration after_;
};

// A node that booted with its clock 3 hours behind, set right by chrony during the wait for a
// lease that starts in an hour: the wait sees the start within a minute of it, where one sleep to
// the start on the wrong clock (4 hours) would wake after the lease had ended.
TEST_F(BlazarTest, WaitForALaterStartNoticesTheWallClockSetRight) {
  LeaseSpec spec = HostLease("later", 1);
  spec.start = sim_->clock().Now() + hours(1);
  spec.end = *spec.start + hours(2);
  ASSERT_TRUE(blazar_->Create(spec).ok());
  SteppedWallClock stepped(sim_->clock(), -hours(3), hours(0));
  BlazarClient blazar(*session_, stepped);
  auto active = blazar.WaitUntilActive("later", seconds(60));
  ASSERT_TRUE(active.ok()) << active.status().ToString();
  EXPECT_EQ(active->status, "ACTIVE");
  EXPECT_LE(sim_->clock().Now(), *spec.start + minutes(1) + seconds(5));
}

// The wall clock stepping an hour ahead during the sleep to the start does not count as that hour
// of the timeout: the lease, still PENDING at its start and ACTIVE at the next poll, is waited for.
TEST_F(BlazarTest, AWallClockStepAfterTheStartDoesNotEndTheWait) {
  LeaseSpec spec = HostLease("soon", 1);
  spec.start = sim_->clock().Now() + minutes(1);
  spec.end = *spec.start + hours(2);
  ASSERT_TRUE(blazar_->Create(spec).ok());
  SteppedWallClock stepped(sim_->clock(), hours(0), hours(1));
  BlazarClient blazar(*session_, stepped);
  auto active = blazar.WaitUntilActive("soon", seconds(60));
  ASSERT_TRUE(active.ok()) << active.status().ToString();
  EXPECT_EQ(active->status, "ACTIVE");
}

TEST_F(BlazarTest, WaitFailsClearlyOnError) {
  ASSERT_TRUE(sim_->Admin("fail_lease", {{"name", "doomed"}}).ok());
  ASSERT_TRUE(blazar_->Create(FlavorLease("doomed")).ok());
  auto active = blazar_->WaitUntilActive("doomed", seconds(300));
  ASSERT_FALSE(active.ok());
  EXPECT_EQ(active.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(active.status().message().find("lease 'doomed'"), std::string::npos);
  EXPECT_NE(active.status().message().find("went to ERROR"), std::string::npos);
}

TEST_F(BlazarTest, ASecondCreateWithTheSameNameIsRefused) {
  ASSERT_TRUE(blazar_->Create(FlavorLease("once")).ok());
  auto again = blazar_->Create(FlavorLease("once"));
  ASSERT_FALSE(again.ok());
  EXPECT_EQ(again.status().code(), StatusCode::kAlreadyExists);
  EXPECT_EQ(LeasesInBooks(), std::vector<std::string>{"once"});
}

TEST_F(BlazarTest, ATimedOutCreateThatWentThroughIsFoundNotRepeated) {
  // Blazar makes the lease, then answers after the client's 1 s timeout.
  Connect("ac-unrestricted", std::chrono::seconds(1));
  ASSERT_TRUE(sim_->Admin("faults", {{"method", "POST"},
                                     {"path", "/blazar/v1/leases"},
                                     {"delay_ms", 2500},
                                     {"after", true},
                                     {"count", 1}})
                  .ok());
  auto lease = blazar_->Create(FlavorLease("slow"));
  ASSERT_TRUE(lease.ok()) << lease.status().ToString();
  EXPECT_EQ(lease->name, "slow");
  EXPECT_EQ(sim_->CountRequests("POST", "/blazar/v1/leases"), 1);
  EXPECT_EQ(LeasesInBooks(), std::vector<std::string>{"slow"});
}

TEST_F(BlazarTest, ACreateRefusedWith503IsSentAgainAfterTheLookup) {
  ASSERT_TRUE(
      sim_->Admin(
              "faults",
              {{"method", "POST"}, {"path", "/blazar/v1/leases"}, {"status", 503}, {"count", 1}})
          .ok());
  auto lease = blazar_->Create(FlavorLease("retried"));
  ASSERT_TRUE(lease.ok()) << lease.status().ToString();
  EXPECT_EQ(sim_->CountRequests("POST", "/blazar/v1/leases"), 2);
  EXPECT_EQ(LeasesInBooks(), std::vector<std::string>{"retried"});
  EXPECT_EQ(http_retry_sleeps_, 0);  // POST is never retried by the HTTP client itself
}

TEST_F(BlazarTest, ACreateThatKeepsFailingGivesUpWithNothingLeftBehind) {
  ASSERT_TRUE(
      sim_->Admin(
              "faults",
              {{"method", "POST"}, {"path", "/blazar/v1/leases"}, {"status", 503}, {"count", 10}})
          .ok());
  auto lease = blazar_->Create(FlavorLease("never"));
  ASSERT_FALSE(lease.ok());
  EXPECT_EQ(lease.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(lease.status().message().find("lease 'never' was not created after 3 attempts"),
            std::string::npos)
      << lease.status().message();
  EXPECT_NE(lease.status().message().find("HTTP 503 (request req-"), std::string::npos);
  EXPECT_EQ(sim_->CountRequests("POST", "/blazar/v1/leases"), 3);
  EXPECT_TRUE(LeasesInBooks().empty());
}

TEST_F(BlazarTest, IdempotentCallsAreRetriedOn503) {
  ASSERT_TRUE(
      sim_->Admin("faults",
                  {{"method", "GET"}, {"path", "/blazar/v1/leases"}, {"status", 503}, {"count", 2}})
          .ok());
  auto leases = blazar_->List();
  ASSERT_TRUE(leases.ok()) << leases.status().ToString();
  EXPECT_EQ(sim_->CountRequests("GET", "/blazar/v1/leases"), 3);
  EXPECT_EQ(http_retry_sleeps_, 2);
}

TEST_F(BlazarTest, NoFlavorCapacityIsSaidPlainly) {
  ASSERT_TRUE(blazar_->Create(FlavorLease("first", "f-h100-4")).ok());
  auto second = blazar_->Create(FlavorLease("second", "f-h100-4"));
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), StatusCode::kResourceExhausted);
  EXPECT_TRUE(second.status().message().starts_with(
      "no capacity for that period: 1 x flavor f-h100-4 from 2030-01-01 00:00 to 2030-01-01 02:50 "
      "UTC"))
      << second.status().message();
  EXPECT_NE(second.status().message().find("Not enough hosts available"), std::string::npos);
  EXPECT_EQ(LeasesInBooks(), std::vector<std::string>{"first"});
}

TEST_F(BlazarTest, NoHostCapacityNamesTheNextFreeSlot) {
  ASSERT_TRUE(blazar_->Create(HostLease("both", 2)).ok());
  auto more = blazar_->Create(HostLease("one-more", 1));
  ASSERT_FALSE(more.ok());
  EXPECT_EQ(more.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(more.status().message().find("next free slot of that length starts at 2030-01-01 "
                                         "02:50 UTC"),
            std::string::npos)
      << more.status().message();
  auto too_many = blazar_->Create(HostLease("three", 3));
  ASSERT_FALSE(too_many.ok());
  EXPECT_NE(too_many.status().message().find("fewer than 3 'gpu_a100_pcie' hosts"),
            std::string::npos)
      << too_many.status().message();
}

TEST_F(BlazarTest, ExtendMovesTheEndOfAHostLease) {
  ASSERT_TRUE(blazar_->Create(HostLease("grow", 1)).ok());
  auto lease = blazar_->Get("grow");
  ASSERT_TRUE(lease.ok());
  auto longer = blazar_->Extend("grow", lease->end + hours(1));
  ASSERT_TRUE(longer.ok()) << longer.status().ToString();
  EXPECT_EQ(FormatUtc(longer->end, "%Y-%m-%d %H:%M"), "2030-01-01 03:50");
}

// Blazar 18 and Chameleon's fork extend flavor:instance reservations while their hosts stay free
// (the simulator refused every such extend with a 409 of its own making until issue 41).
TEST_F(BlazarTest, ExtendingAFlavorLeaseMovesItsEndOrSaysThereIsNoRoom) {
  ASSERT_TRUE(blazar_->Create(FlavorLease("kvm", "f-h100-4")).ok());
  auto lease = blazar_->Get("kvm");
  ASSERT_TRUE(lease.ok());
  auto longer = blazar_->Extend("kvm", lease->end + hours(1));
  ASSERT_TRUE(longer.ok()) << longer.status().ToString();
  EXPECT_EQ(longer->end, lease->end + hours(1));
  // f-h100-4 has room for one: a lease right after it leaves no room to grow.
  LeaseSpec next = FlavorLease("next", "f-h100-4");
  next.start = longer->end + minutes(10);
  next.end = *next.start + hours(1);
  ASSERT_TRUE(blazar_->Create(next).ok());
  auto refused = blazar_->Extend("kvm", longer->end + hours(1));
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(refused.status().message().find("Not enough hosts available"), std::string::npos)
      << refused.status().message();
}

// While Blazar's manager works on a lease it refuses changes with a 500 "Invalid lease status.":
// a refusal to retry later, not a cloud that did not answer.
TEST_F(BlazarTest, AnExtendWhileBlazarChangesTheLeaseSaysSo) {
  ASSERT_TRUE(blazar_->Create(HostLease("busy", 1)).ok());
  ASSERT_TRUE(sim_->Admin("lease_status", {{"name", "busy"}, {"status", "UPDATING"}}).ok());
  auto lease = blazar_->Get("busy");
  ASSERT_TRUE(lease.ok());
  auto longer = blazar_->Extend("busy", lease->end + hours(1));
  ASSERT_FALSE(longer.ok());
  EXPECT_EQ(longer.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(longer.status().message().find("lease 'busy' is UPDATING"), std::string::npos)
      << longer.status().message();
  EXPECT_NE(longer.status().message().find("[PUT "), std::string::npos);
  EXPECT_NE(longer.status().message().find("Invalid lease status."), std::string::npos);
}

// What the real Blazar 18 answered in tests/blazar (docs/cloud.md), so that the simulator cannot
// accept a request Blazar refuses: its one date format, its requirement syntax and texts.
TEST_F(BlazarTest, TheSimulatorRefusesWhatBlazarRefusesWithItsWords) {
  auto post = [&](const json& body) {
    http::Request request;
    request.method = "POST";
    request.url = "/v1/leases";
    request.body = body.dump();
    StatusOr<Exchange> exchange = session_->Call("reservation", request);
    EXPECT_TRUE(exchange.ok()) << exchange.status().ToString();
    return exchange.ok() ? exchange->response : http::Response{};
  };
  json seconds_date = LeaseRequestBody(HostLease("dated", 1));
  seconds_date["end_date"] = seconds_date["end_date"].get<std::string>() + ":00";
  http::Response dated = post(seconds_date);
  EXPECT_EQ(dated.status, 400);
  EXPECT_EQ(ServiceMessage(dated), seconds_date["end_date"].get<std::string>() +
                                       " is an invalid date. Required format: %Y-%m-%d %H:%M");

  json malformed = LeaseRequestBody(HostLease("malformed", 1));
  malformed["reservations"][0]["resource_properties"] = "[\"==\", \"$node_type\"";
  http::Response refused = post(malformed);
  EXPECT_EQ(refused.status, 400);
  EXPECT_EQ(ServiceMessage(refused), "Malformed requirements [\"==\", \"$node_type\"");

  // Blazar reads "=" as "==".
  json single = LeaseRequestBody(HostLease("single", 1));
  single["reservations"][0]["resource_properties"] = "[\"=\", \"$node_type\", \"gpu_a100_pcie\"]";
  EXPECT_EQ(post(single).status, 201);
}

// A lease made elsewhere (Horizon, python-chi) with a floating IP (upstream's virtual:floatingip)
// and Chameleon's network and device reservations beside its hosts: each is described from what
// Blazar shows of it, not as "0 x" of its type.
TEST_F(BlazarTest, ReservationsLlmctlDoesNotMakeAreDescribedAsBlazarShowsThem) {
  const json body = {
      {"name", "chi"},
      {"start_date", "now"},
      {"end_date", "2030-01-01 02:00"},
      {"events", json::array()},
      {"reservations",
       {{{"resource_type", "physical:host"},
         {"resource_properties", R"(["==", "$node_type", "gpu_a100_pcie"])"},
         {"hypervisor_properties", ""},
         {"min", 1},
         {"max", 1}},
        {{"resource_type", "virtual:floatingip"}, {"network_id", "net-public"}, {"amount", 2}},
        {{"resource_type", "network"},
         {"network_name", "my-vlan"},
         {"network_properties", ""},
         {"resource_properties", R"(["==", "$physical_network", "physnet1"])"}},
        {{"resource_type", "device"},
         {"min", 1},
         {"max", 1},
         {"resource_properties", R"(["==", "$machine_name", "raspberrypi4-64"])"}}}}};
  ASSERT_TRUE(session_->CallJson("reservation", "POST", "/v1/leases", &body).ok());
  auto lease = blazar_->Get("chi");
  ASSERT_TRUE(lease.ok()) << lease.status().ToString();
  std::vector<std::string> described;
  for (const Reservation& reservation : lease->reservations) {
    described.push_back(DescribeReservation(reservation));
  }
  EXPECT_EQ(described,
            (std::vector<std::string>{R"(1 x physical:host ["==", "$node_type", "gpu_a100_pcie"])",
                                      "2 x floating IP on network net-public", "network",
                                      R"(1 x device ["==", "$machine_name", "raspberrypi4-64"])"}));
  // Blazar requires each type's fields.
  json missing = body;
  missing["name"] = "chi-2";
  missing["reservations"] = {{{"resource_type", "virtual:floatingip"}, {"amount", 1}}};
  auto refused = session_->CallJson("reservation", "POST", "/v1/leases", &missing);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("Missing parameter network_id"), std::string::npos)
      << refused.status().ToString();
}

TEST_F(BlazarTest, UnknownLeaseSuggestsTheNearestName) {
  ASSERT_TRUE(blazar_->Create(FlavorLease("training-run")).ok());
  auto missing = blazar_->Get("training-rn");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().message(),
            "no lease named 'training-rn' (did you mean 'training-run'?)");
  EXPECT_EQ(blazar_->Delete("nothing").code(), StatusCode::kNotFound);
}

TEST_F(BlazarTest, RestrictedApplicationCredentialGetsAHint) {
  Connect("ac-restricted");
  auto lease = blazar_->Create(FlavorLease("restricted"));
  ASSERT_FALSE(lease.ok());
  // Blazar's 500 is its refusal, not a cloud that did not answer.
  EXPECT_EQ(lease.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(lease.status().message().find("--unrestricted"), std::string::npos)
      << lease.status().message();
  EXPECT_TRUE(LeasesInBooks().empty());
}

TEST_F(BlazarTest, ACatalogUrlEndingInV1IsUsedAsIs) {
  StartSimulator({"--reservation-suffix", "/v1"});
  ASSERT_TRUE(blazar_->Create(FlavorLease("v1")).ok());
  auto leases = blazar_->List();
  ASSERT_TRUE(leases.ok()) << leases.status().ToString();
  EXPECT_EQ(leases->size(), 1u);
  EXPECT_EQ(sim_->CountRequests("GET", "/blazar/v1/leases"), 2);  // the name check, then List
}

TEST_F(BlazarTest, RejectsImpossibleSpecsBeforeCallingBlazar) {
  LeaseSpec spec = FlavorLease("backwards");
  spec.end = sim_->clock().Now() - minutes(1);
  EXPECT_EQ(blazar_->Create(spec).status().code(), StatusCode::kInvalidArgument);
  spec = FlavorLease("both");
  spec.node_type = "gpu_a100_pcie";
  EXPECT_EQ(blazar_->Create(spec).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(sim_->CountRequests("POST", "/blazar"), 0);
}

}  // namespace
}  // namespace llmctl::openstack
