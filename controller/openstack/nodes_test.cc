#include "controller/openstack/nodes.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/utc_time.h"
#include "controller/openstack/glance.h"
#include "tests/openstack_sim/simulator.h"

namespace llmctl::openstack {
namespace {

using llmctl::testing::Simulator;
using nlohmann::json;
using std::chrono::hours;
using std::chrono::minutes;

// One simulator for the binary: each test uses its own lease, so their resources never meet.
class NodesTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto sim = Simulator::Start();
    ASSERT_TRUE(sim.ok()) << sim.status().ToString();
    sim_ = std::move(*sim).release();
    ASSERT_TRUE(
        sim_->Admin("capacity",
                    {{"flavor", {{"f-h100-1", 50}}},
                     {"hosts", json::array({{{"id", "1"}, {"node_type", "gpu_a100_pcie"}},
                                            {{"id", "2"}, {"node_type", "gpu_a100_pcie"}}})}})
            .ok());
  }
  static void TearDownTestSuite() {
    delete sim_;
    sim_ = nullptr;
  }

  void SetUp() override {
    http::ClientOptions options;
    options.sleep = [](std::chrono::milliseconds) {};
    http_ = std::make_unique<http::HttpClient>(options);
    auto creds = CredentialsFromEnvironment(sim_->Environment());
    ASSERT_TRUE(creds.ok()) << creds.status().ToString();
    SessionOptions session_options;
    session_options.request_timeout = std::chrono::milliseconds(700);
    session_ = std::make_unique<Session>(*creds, *http_, sim_->clock(), session_options);
    nodes_ =
        std::make_unique<NodeManager>(*session_, sim_->clock(), NodeOptions{},
                                      [this](const std::string& line) { log_.push_back(line); });
  }

  // An ACTIVE lease: a KVM flavor one, or a bare-metal one when `node_type` is set.
  Lease ActiveLease(const std::string& name, const std::string& node_type = "") {
    BlazarClient blazar(*session_, sim_->clock());
    LeaseSpec spec;
    spec.name = name;
    spec.end = sim_->clock().Now() + hours(2) + minutes(50);
    if (node_type.empty()) {
      spec.flavor_id = "f-h100-1";
    } else {
      spec.node_type = node_type;
    }
    auto created = blazar.Create(spec);
    EXPECT_TRUE(created.ok()) << created.status().ToString();
    auto active = blazar.WaitUntilActive(name, std::chrono::seconds(300));
    EXPECT_TRUE(active.ok()) << active.status().ToString();
    return active.ok() ? *active : Lease{};
  }

  // What the simulator holds whose name (or floating IP description) mentions `lease`.
  json Holding(const std::string& lease) {
    json held = json::object();
    json books = *sim_->Books();
    for (const char* table : {"servers", "volumes", "floating_ips"}) {
      held[table] = json::array();
      for (const json& item : books[table]) {
        std::string label =
            item.contains("description") ? item.value("description", "") : item.value("name", "");
        if (label.find("-" + lease + "-") != std::string::npos) held[table].push_back(item);
      }
    }
    return held;
  }

  static Simulator* sim_;
  std::unique_ptr<http::HttpClient> http_;
  std::unique_ptr<Session> session_;
  std::unique_ptr<NodeManager> nodes_;
  std::vector<std::string> log_;
};

Simulator* NodesTest::sim_ = nullptr;

TEST_F(NodesTest, KvmNodeBootsFromAVolumeResumesAndGoesDownCompletely) {
  ActiveLease("kvm");
  NodeSpec spec;
  spec.lease = "kvm";
  spec.key_name = "demo-key";
  int user_data_calls = 0;
  spec.user_data = [&](const std::string& node) -> StatusOr<std::string> {
    ++user_data_calls;
    EXPECT_EQ(node, "kvm");
    return std::string("#cloud-config\n");
  };
  auto node = nodes_->Up(spec);
  ASSERT_TRUE(node.ok()) << node.status().ToString();
  ASSERT_TRUE(node->server && node->volume && node->floating_ip);
  EXPECT_EQ(node->server->name, "llmctl-kvm-server");
  EXPECT_EQ(node->server->status, "ACTIVE");
  EXPECT_EQ(node->volume->name, "llmctl-kvm-boot");
  EXPECT_EQ(node->volume->status, "in-use");
  EXPECT_EQ(node->volume->size_gb, 200);
  EXPECT_TRUE(node->floating_ip->address.starts_with("127.0.0.")) << node->floating_ip->address;
  EXPECT_EQ(node->AgentAddress(), node->floating_ip->address + ":7443");
  EXPECT_EQ(node->server->floating_addresses, std::vector<std::string>{node->floating_ip->address});
  EXPECT_EQ(user_data_calls, 1);

  // A rerun finds everything by name and makes nothing new.
  auto again = nodes_->Up(spec);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(again->server->id, node->server->id);
  EXPECT_EQ(user_data_calls, 1);
  EXPECT_EQ(sim_->CountRequests("POST", "/nova/v2.1/servers"), 1);
  EXPECT_EQ(sim_->CountRequests("POST", "/cinder/"), 1);
  json held = Holding("kvm");
  EXPECT_EQ(held["servers"].size(), 1u);
  EXPECT_EQ(held["volumes"].size(), 1u);
  EXPECT_EQ(held["floating_ips"].size(), 1u);

  ASSERT_TRUE(nodes_->Down("kvm").ok());
  EXPECT_EQ(Holding("kvm"), json({{"servers", json::array()},
                                  {"volumes", json::array()},
                                  {"floating_ips", json::array()}}));
  json books = *sim_->Books();
  for (const json& group : books["security_groups"]) {
    EXPECT_FALSE(group["description"].get<std::string>().starts_with("llmctl:")) << group;
  }
  EXPECT_EQ(books["ports"], json::array());
  EXPECT_TRUE(nodes_->Down("kvm").ok());  // safe to repeat
  EXPECT_EQ(nodes_->Show("kvm").status().code(), StatusCode::kNotFound);
}

TEST_F(NodesTest, BareMetalNodeBootsTheImageWithTheReservationHint) {
  ActiveLease("bm", "gpu_a100_pcie");
  NodeSpec spec;
  spec.lease = "bm";
  auto node = nodes_->Up(spec);
  ASSERT_TRUE(node.ok()) << node.status().ToString();
  EXPECT_EQ(node->server->status, "ACTIVE");  // the simulator's scheduler needs the hint
  EXPECT_EQ(node->server->flavor_id, "f-baremetal");
  EXPECT_FALSE(node->volume.has_value());
  ASSERT_TRUE(nodes_->Down("bm").ok());
  EXPECT_EQ(Holding("bm")["servers"], json::array());
}

// Chameleon's users reserve a floating IP in the same lease as their hosts: the node boots on the
// host reservation whatever the order (Nova's scheduler admits a server only on a reservation of
// hosts or a flavor), and a lease of floating IPs alone has nothing to boot on.
TEST_F(NodesTest, ALeaseThatAlsoReservesAFloatingIpBootsOnItsHosts) {
  const auto end = sim_->clock().Now() + hours(2);
  const json floating_ip = {
      {"resource_type", "virtual:floatingip"}, {"network_id", "net-public"}, {"amount", 1}};
  const json host = {{"resource_type", "physical:host"},
                     {"resource_properties", R"(["==", "$node_type", "gpu_a100_pcie"])"},
                     {"hypervisor_properties", ""},
                     {"min", 1},
                     {"max", 1}};
  BlazarClient blazar(*session_, sim_->clock());
  for (const auto& [name, reservations] :
       {std::pair<std::string, json>{"with-ip", json::array({floating_ip, host})},
        std::pair<std::string, json>{"only-ip", json::array({floating_ip})}}) {
    const json body = {{"name", name},
                       {"start_date", "now"},
                       {"end_date", FormatUtc(end, "%Y-%m-%d %H:%M")},
                       {"events", json::array()},
                       {"reservations", reservations}};
    auto created = session_->CallJson("reservation", "POST", "/v1/leases", &body);
    ASSERT_TRUE(created.ok()) << created.status().ToString();
    ASSERT_TRUE(blazar.WaitUntilActive(name, std::chrono::seconds(300)).ok());
  }
  NodeSpec spec;
  spec.lease = "with-ip";
  auto node = nodes_->Up(spec);
  ASSERT_TRUE(node.ok()) << node.status().ToString();
  EXPECT_EQ(node->server->status, "ACTIVE");
  ASSERT_TRUE(nodes_->Down("with-ip").ok());

  spec.lease = "only-ip";
  auto nothing = nodes_->Up(spec);
  EXPECT_EQ(nothing.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(nothing.status().message(),
            "lease only-ip reserves no hosts or flavor to boot a node on (it holds 1 x floating IP "
            "on network net-public)");
  EXPECT_EQ(Holding("only-ip")["servers"], json::array());
}

TEST_F(NodesTest, ServerInErrorQuotesNovasFaultAndDownClearsIt) {
  ActiveLease("broken");
  ASSERT_TRUE(sim_->Admin("compute", {{"fail_servers",
                                       {{"llmctl-broken-server",
                                         "No valid host was found. Exceeded max scheduling "
                                         "attempts 3 for instance"}}}})
                  .ok());
  NodeSpec spec;
  spec.lease = "broken";
  auto node = nodes_->Up(spec);
  ASSERT_FALSE(node.ok());
  EXPECT_EQ(node.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(node.status().message().find("(llmctl-broken-server) failed to build: No valid host "
                                         "was found. Exceeded max scheduling attempts 3"),
            std::string::npos)
      << node.status().message();
  auto shown = nodes_->Show("broken");
  ASSERT_TRUE(shown.ok());
  EXPECT_EQ(shown->server->status, "ERROR");
  ASSERT_TRUE(nodes_->Down("broken").ok());
  EXPECT_EQ(Holding("broken")["servers"], json::array());
  EXPECT_EQ(Holding("broken")["volumes"], json::array());
}

TEST_F(NodesTest, ACreateThatTimedOutIsLookedUpNotSentAgain) {
  ActiveLease("slowapi");
  // Nova makes the server but answers after the client's 700 ms timeout; Cinder's first create
  // fails with a 503 before acting.
  ASSERT_TRUE(sim_->Admin("faults", {{"method", "POST"},
                                     {"path", "/nova/v2.1/servers"},
                                     {"delay_ms", 1500},
                                     {"after", true},
                                     {"count", 1}})
                  .ok());
  ASSERT_TRUE(sim_->Admin("faults",
                          {{"method", "POST"}, {"path", "/cinder/"}, {"status", 503}, {"count", 1}})
                  .ok());
  int servers_before = sim_->CountRequests("POST", "/nova/v2.1/servers");
  int volumes_before = sim_->CountRequests("POST", "/cinder/");
  NodeSpec spec;
  spec.lease = "slowapi";
  auto node = nodes_->Up(spec);
  ASSERT_TRUE(node.ok()) << node.status().ToString();
  EXPECT_EQ(sim_->CountRequests("POST", "/nova/v2.1/servers") - servers_before, 1);
  EXPECT_EQ(sim_->CountRequests("POST", "/cinder/") - volumes_before, 2);
  json held = Holding("slowapi");
  EXPECT_EQ(held["servers"].size(), 1u);
  EXPECT_EQ(held["volumes"].size(), 1u);
  ASSERT_TRUE(nodes_->Down("slowapi").ok());
}

TEST_F(NodesTest, ASlowBuildRunsOutOfTimeAndTheRerunFinishesIt) {
  ActiveLease("slowbuild");
  ASSERT_TRUE(sim_->Admin("compute", {{"build_seconds", 900}}).ok());
  NodeOptions impatient;
  impatient.server_timeout = std::chrono::seconds(120);
  NodeManager nodes(*session_, sim_->clock(), impatient);
  NodeSpec spec;
  spec.lease = "slowbuild";
  auto first = nodes.Up(spec);
  ASSERT_FALSE(first.ok());
  EXPECT_EQ(first.status().code(), StatusCode::kDeadlineExceeded);
  EXPECT_NE(first.status().message().find("is still not ACTIVE after 120 s"), std::string::npos)
      << first.status().message();
  auto second = nodes_->Up(spec);  // the default 20 min
  ASSERT_TRUE(sim_->Admin("compute", {{"build_seconds", 60}}).ok());
  ASSERT_TRUE(second.ok()) << second.status().ToString();
  EXPECT_EQ(Holding("slowbuild")["servers"].size(), 1u);
  ASSERT_TRUE(nodes_->Down("slowbuild").ok());
}

TEST_F(NodesTest, ReusesAFreeFloatingIpAndRefusesWhatCannotWork) {
  ActiveLease("reuse");
  // A free, unlabelled address the project already holds (as the labs leave them).
  json body = {{"floatingip", {{"floating_network_id", "net-public"}}}};
  auto free_ip = session_->CallJson("network", "POST", "/v2.0/floatingips", &body);
  ASSERT_TRUE(free_ip.ok()) << free_ip.status().ToString();
  NodeSpec spec;
  spec.lease = "reuse";
  spec.key_name = "no-such-key";
  auto missing_key = nodes_->Up(spec);
  EXPECT_EQ(missing_key.status().message(),
            "no key pair 'no-such-key' in this project at this site (openstack keypair list "
            "shows them)");
  spec.key_name = "";
  spec.image = "CC-Ubuntu99.04";
  EXPECT_EQ(nodes_->Up(spec).status().message(),
            "no image named 'CC-Ubuntu99.04' at this site (openstack image list shows the names)");
  spec.image = "CC-Ubuntu24.04-CUDA";
  auto node = nodes_->Up(spec);
  ASSERT_TRUE(node.ok()) << node.status().ToString();
  EXPECT_EQ(node->floating_ip->id, (*free_ip)["floatingip"]["id"]);
  ASSERT_TRUE(nodes_->Down("reuse").ok());

  NodeSpec pending;
  BlazarClient blazar(*session_, sim_->clock());
  LeaseSpec later{
      "later", sim_->clock().Now() + hours(5), sim_->clock().Now() + hours(6), "f-h100-1", 1, "",
      1};
  ASSERT_TRUE(blazar.Create(later).ok());
  pending.lease = "later";
  auto not_yet = nodes_->Up(pending);
  EXPECT_EQ(not_yet.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(not_yet.status().message().find("lease later is PENDING"), std::string::npos);
}

TEST_F(NodesTest, GlanceFollowsNextAndRefusesAnAmbiguousName) {
  ASSERT_TRUE(
      sim_->Admin("images", {{"page_size", 1},
                             {"add", json::array({{{"id", "img-dup-1"}, {"name", "dup"}},
                                                  {{"id", "img-dup-2"}, {"name", "dup"}}})}})
          .ok());
  GlanceClient glance(*session_);
  auto dup = glance.FindImage("dup");
  ASSERT_FALSE(dup.ok());
  EXPECT_EQ(dup.status().message(),
            "2 images are named 'dup' (img-dup-1, img-dup-2); pass an unambiguous name");
  auto image = glance.FindImage("CC-Ubuntu22.04");
  ASSERT_TRUE(image.ok()) << image.status().ToString();
  EXPECT_EQ(image->id, "img-ubuntu-2204");
  ASSERT_TRUE(sim_->Admin("images", {{"page_size", 25}}).ok());
  // A member of another type in Glance's answer is read as absent, not thrown.
  ASSERT_TRUE(
      sim_->Admin("images",
                  {{"add", json::array({{{"id", "img-odd"}, {"name", "odd"}, {"status", 5}}})}})
          .ok());
  EXPECT_EQ(glance.FindImage("odd").status().message(),
            "image 'odd' (img-odd) is of no status Glance names, not active");
}

TEST_F(NodesTest, EveryServiceReissuesTheTokenAfterA401) {
  GlanceClient glance(*session_);
  NovaClient nova(*session_, sim_->clock());
  CinderClient cinder(*session_, sim_->clock());
  NeutronClient neutron(*session_, sim_->clock());
  ASSERT_TRUE(glance.FindImage("CC-Ubuntu24.04").ok());
  int issued = (*sim_->Books())["tokens_issued"];
  std::vector<std::function<Status()>> calls = {
      [&] { return glance.FindImage("CC-Ubuntu24.04").status(); },
      [&] { return nova.ListServers().status(); },
      [&] { return cinder.FindByName("nothing").status(); },
      [&] { return neutron.FindNetwork("sharednet1").status(); }};
  for (const auto& call : calls) {
    ASSERT_TRUE(sim_->Admin("revoke_tokens").ok());
    Status status = call();
    EXPECT_TRUE(status.ok()) << status.ToString();
  }
  EXPECT_EQ((*sim_->Books())["tokens_issued"], issued + 4);
}

// Any project member can name a server or set its metadata: `node list` and `node show` read
// what is not llmctl's without crashing, and never dial a port that is none.
TEST_F(NodesTest, ServersNamedOrLabelledByOthersAreReadSafely) {
  NovaClient nova(*session_, sim_->clock());
  ServerSpec spec;
  spec.flavor_id = "f-small";
  spec.image_id = "img-ubuntu-2204";
  spec.network_id = "net-sharednet1";
  // llmctl-'s prefix and -server's suffix overlap in it: cutting both off overran the name.
  spec.name = "llmctl-server";
  auto overlapping = nova.FindOrCreateServer(spec);
  ASSERT_TRUE(overlapping.ok()) << overlapping.status().ToString();
  spec.name = NamesForNode("odd-port").server;
  spec.metadata[kAgentPortMetadata] = "70000";
  auto odd_port = nova.FindOrCreateServer(spec);
  ASSERT_TRUE(odd_port.ok()) << odd_port.status().ToString();

  auto nodes = nodes_->List();
  ASSERT_TRUE(nodes.ok()) << nodes.status().ToString();
  std::vector<std::string> names;
  for (const Node& node : *nodes) names.push_back(node.name);
  EXPECT_NE(std::find(names.begin(), names.end(), "odd-port"), names.end());
  EXPECT_EQ(std::find(names.begin(), names.end(), "server"), names.end());
  auto shown = nodes_->Show("odd-port");
  ASSERT_TRUE(shown.ok()) << shown.status().ToString();
  EXPECT_EQ(shown->agent_port, 0);
  EXPECT_EQ(shown->AgentAddress(), "");

  EXPECT_TRUE(nova.DeleteServer(overlapping->id, std::chrono::seconds(300)).ok());
  EXPECT_TRUE(nova.DeleteServer(odd_port->id, std::chrono::seconds(300)).ok());
}

TEST(NodeOfServerTest, OnlyNamesNamesForNodeMakes) {
  EXPECT_EQ(NodeOfServer("llmctl-llm-h100-server"), "llm-h100");
  EXPECT_EQ(NodeOfServer(NamesForNode("a").server), "a");
  EXPECT_EQ(NodeOfServer("llmctl-server"), std::nullopt);
  EXPECT_EQ(NodeOfServer("llmctl--server"), std::nullopt);
  EXPECT_EQ(NodeOfServer("llmctl-a-boot"), std::nullopt);
  EXPECT_EQ(NodeOfServer("other-a-server"), std::nullopt);
}

TEST(AgentPortOfTest, OnlyAPortInDecimalIsAPort) {
  Server server;
  EXPECT_EQ(AgentPortOf(server), 0);
  for (const char* text : {"99999999999", "70000", "0", "-5", "7443abc", " 7443", "", "0x1d23"}) {
    server.metadata[kAgentPortMetadata] = text;
    EXPECT_EQ(AgentPortOf(server), 0) << text;
  }
  server.metadata[kAgentPortMetadata] = "7443";
  EXPECT_EQ(AgentPortOf(server), 7443);
  server.metadata[kAgentPortMetadata] = "65535";
  EXPECT_EQ(AgentPortOf(server), 65535);
}

TEST(ParseVolumeTest, ASizePastAnIntIsUnknownNotWrapped) {
  auto size = [](const char* number) {
    auto volume = ParseVolume(
        json::parse(std::string(R"({"id": "v", "status": "available", "size": )") + number + "}"));
    EXPECT_TRUE(volume.ok()) << volume.status().ToString();
    return volume.ok() ? volume->size_gb : -1;
  };
  EXPECT_EQ(size("200"), 200);
  EXPECT_EQ(size("4294967496"), 0);  // 2^32 + 200: wrapped, it read as 200
  EXPECT_EQ(size("18446744073709551615"), 0);
  EXPECT_EQ(size("-9223372036854775808"), 0);
  EXPECT_EQ(size("2147483647"), 2147483647);
}

// Every id llmctl puts into a URL ("/servers/" + id) is checked where the answer is read: an
// empty one would make that URL the list of all servers, "..", '/', '?', '#' or '%' another
// resource. The message names the service's object and the field.
TEST(ParseIdsTest, AnEmptyAbsentOrUnsafeIdIsRefusedNamingTheServiceAndTheField) {
  struct Reader {
    std::string what;  // the message's start
    std::function<Status(const json&)> parse;
    json object;  // a good one, its "id" replaced below
  };
  const auto status_of = [](auto parsed) { return parsed.status(); };
  const std::vector<Reader> readers = {
      {"Blazar lease",
       [&](const json& v) { return status_of(ParseLease(v)); },
       {{"name", "n"}, {"start_date", "2030-01-01 00:00"}, {"end_date", "2030-01-02 00:00"}}},
      {"Nova server", [&](const json& v) { return status_of(ParseServer(v)); }, {{"name", "n"}}},
      {"Glance image", [&](const json& v) { return status_of(ParseImage(v)); }, {{"name", "n"}}},
      {"Cinder volume",
       [&](const json& v) { return status_of(ParseVolume(v)); },
       {{"status", "available"}}},
      {"Neutron security group",
       [&](const json& v) { return status_of(ParseSecurityGroup(v)); },
       {{"name", "n"}}},
      {"Neutron port",
       [&](const json& v) { return status_of(ParsePort(v)); },
       {{"device_id", "s"}}},
      {"Neutron floating IP",
       [&](const json& v) { return status_of(ParseFloatingIp(v)); },
       {{"floating_ip_address", "192.0.2.7"}}},
  };
  for (const Reader& reader : readers) {
    json good = reader.object;
    good["id"] = "3f2b6c1e-9d4a-4f7e-8a51-2c0d9e6b7a10";
    EXPECT_TRUE(reader.parse(good).ok()) << reader.what << ": " << reader.parse(good).ToString();

    json empty = reader.object;
    empty["id"] = "";
    Status status = reader.parse(empty);
    EXPECT_EQ(status.code(), StatusCode::kInternal) << reader.what;
    EXPECT_EQ(status.message(), reader.what + "'s 'id' is empty");

    json absent = reader.object;
    status = reader.parse(absent);
    EXPECT_EQ(status.message(), reader.what + "'s 'id' is missing");

    for (const char* unsafe : {"..", ".", "a/b", "a?b", "a#b", "%2F", "a\\b", "a\nb"}) {
      json object = reader.object;
      object["id"] = unsafe;
      status = reader.parse(object);
      EXPECT_EQ(status.code(), StatusCode::kInternal) << reader.what << " " << unsafe;
      EXPECT_NE(status.message().find(reader.what + "'s 'id' '"), std::string::npos)
          << status.message();
      EXPECT_NE(status.message().find("cannot be part of a URL path"), std::string::npos)
          << status.message();
    }
  }

  // A lease's reservations: their ids go into Nova's scheduler hint and the flavor's match.
  const json lease = {
      {"id", "l1"},
      {"start_date", "2030-01-01 00:00"},
      {"end_date", "2030-01-02 00:00"},
      {"reservations", json::array({{{"id", ""}, {"resource_type", "physical:host"}}})}};
  EXPECT_EQ(ParseLease(lease).status().message(), "Blazar lease l1's reservation's 'id' is empty");
}

}  // namespace
}  // namespace llmctl::openstack
