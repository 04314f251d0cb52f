#include "controller/openstack/session.h"

#include <gtest/gtest.h>

#include <memory>

#include "tests/openstack_sim/simulator.h"

namespace llmctl::openstack {
namespace {

using llmctl::testing::Simulator;
using nlohmann::json;

http::ClientOptions FastRetries() {
  http::ClientOptions options;
  options.sleep = [](std::chrono::milliseconds) {};
  return options;
}

class SessionTest : public ::testing::Test {
 protected:
  void StartSimulator(const std::vector<std::string>& args = {}) {
    auto sim = Simulator::Start(args);
    ASSERT_TRUE(sim.ok()) << sim.status().ToString();
    sim_ = std::move(*sim);
  }
  void SetUp() override { StartSimulator(); }

  std::unique_ptr<Session> MakeSession(const std::map<std::string, std::string>& env = {},
                                       SessionOptions options = {}) {
    auto creds = CredentialsFromEnvironment(sim_->Environment(env));
    EXPECT_TRUE(creds.ok()) << creds.status().ToString();
    return std::make_unique<Session>(*creds, http_, sim_->clock(), options);
  }

  int TokenRequests() { return sim_->CountRequests("POST", "/v3/auth/tokens"); }

  std::unique_ptr<Simulator> sim_;
  http::HttpClient http_{FastRetries()};
};

TEST_F(SessionTest, ApplicationCredentialFindsTheRegionsPublicEndpoints) {
  auto session = MakeSession();
  auto url = session->EndpointUrl("reservation");
  ASSERT_TRUE(url.ok()) << url.status().ToString();
  EXPECT_EQ(*url, sim_->url() + "/blazar");
  // block-storage is listed as volumev3 in this catalog.
  auto volume = session->EndpointUrl("block-storage");
  ASSERT_TRUE(volume.ok()) << volume.status().ToString();
  EXPECT_EQ(*volume, sim_->url() + "/cinder/v3/p-demo");
  auto token = session->CurrentToken();
  ASSERT_TRUE(token.ok());
  EXPECT_EQ(token->project_id, "p-demo");
}

TEST_F(SessionTest, PasswordByNamesAndByIds) {
  auto by_name = MakeSession({{"OS_AUTH_TYPE", "password"},
                              {"OS_APPLICATION_CREDENTIAL_ID", ""},
                              {"OS_APPLICATION_CREDENTIAL_SECRET", ""},
                              {"OS_USERNAME", "demo"},
                              {"OS_USER_DOMAIN_NAME", "Default"},
                              {"OS_PASSWORD", "demo-password"},
                              {"OS_PROJECT_NAME", "demo-project"},
                              {"OS_PROJECT_DOMAIN_NAME", "Default"}});
  EXPECT_TRUE(by_name->CurrentToken().ok());
  auto by_id = MakeSession({{"OS_AUTH_TYPE", "v3password"},
                            {"OS_USER_ID", "u-demo"},
                            {"OS_PASSWORD", "demo-password"},
                            {"OS_PROJECT_ID", "p-demo"}});
  auto token = by_id->CurrentToken();
  ASSERT_TRUE(token.ok()) << token.status().ToString();
  EXPECT_EQ(token->project_id, "p-demo");
}

std::map<std::string, std::string> OidcEnvironment(const Simulator& sim,
                                                   const std::string& password) {
  return {{"OS_AUTH_TYPE", "v3oidcpassword"},
          {"OS_APPLICATION_CREDENTIAL_ID", ""},
          {"OS_APPLICATION_CREDENTIAL_SECRET", ""},
          {"OS_USERNAME", "oidc-user"},
          {"OS_PASSWORD", password},
          {"OS_PROJECT_ID", "p-demo"},
          {"OS_IDENTITY_PROVIDER", "chameleon"},
          {"OS_PROTOCOL", "openid"},
          {"OS_DISCOVERY_ENDPOINT", sim.url() + "/oidc/.well-known/openid-configuration"},
          {"OS_CLIENT_ID", "keystone-kvm-prod"},
          {"OS_CLIENT_SECRET", "none"}};
}

TEST_F(SessionTest, ChameleonOidcPasswordFlowEndsInAProjectToken) {
  auto session = MakeSession(OidcEnvironment(*sim_, "oidc-password"));
  auto url = session->EndpointUrl("compute");
  ASSERT_TRUE(url.ok()) << url.status().ToString();
  EXPECT_EQ(*url, sim_->url() + "/nova/v2.1");
  EXPECT_EQ(sim_->CountRequests("POST", "/oidc/token"), 1);
  EXPECT_EQ(sim_->CountRequests("POST", "/v3/OS-FEDERATION/"), 1);
  EXPECT_EQ(TokenRequests(), 1);  // the rescope
}

// Every way of logging in, refused: the message says who was refused where, never the secret.
TEST_F(SessionTest, RefusalsNameTheIdentityButNeverTheSecret) {
  const std::string secret = "Sup3r-Secret-Value";
  std::vector<std::map<std::string, std::string>> refused = {
      {{"OS_APPLICATION_CREDENTIAL_SECRET", secret}},
      {{"OS_AUTH_TYPE", "password"},
       {"OS_USERNAME", "demo"},
       {"OS_PASSWORD", secret},
       {"OS_PROJECT_ID", "p-demo"}},
      OidcEnvironment(*sim_, secret),
  };
  for (const auto& env : refused) {
    auto token = MakeSession(env)->CurrentToken();
    ASSERT_FALSE(token.ok());
    EXPECT_EQ(token.status().code(), StatusCode::kUnauthenticated) << token.status().ToString();
    const std::string& message = token.status().message();
    EXPECT_EQ(message.find(secret), std::string::npos) << message;
    EXPECT_NE(message.find("authenticating to " + sim_->auth_url()), std::string::npos) << message;
    EXPECT_NE(message.find("HTTP 401 (request req-"), std::string::npos) << message;
  }
}

TEST_F(SessionTest, TokenIsReissuedOnlyWhenLessThanTheMarginRemains) {
  StartSimulator({"--token-ttl", "600"});
  auto session = MakeSession();
  ASSERT_TRUE(session->EndpointUrl("reservation").ok());
  sim_->clock().SleepFor(std::chrono::seconds(470));  // 130 s left: kept
  ASSERT_TRUE(session->CallJson("reservation", "GET", "/v1/leases").ok());
  EXPECT_EQ(TokenRequests(), 1);
  sim_->clock().SleepFor(std::chrono::seconds(20));  // 110 s left: re-issued before use
  auto leases = session->CallJson("reservation", "GET", "/v1/leases");
  ASSERT_TRUE(leases.ok()) << leases.status().ToString();
  EXPECT_EQ(TokenRequests(), 2);
}

TEST_F(SessionTest, TheSimulatorRefusesAnExpiredToken) {
  StartSimulator({"--token-ttl", "600"});
  auto token = MakeSession()->CurrentToken();
  ASSERT_TRUE(token.ok());
  sim_->clock().SleepFor(std::chrono::seconds(600));
  http::Request request;
  request.url = sim_->url() + "/blazar/v1/leases";
  request.headers.Add("X-Auth-Token", token->id);
  auto response = http_.Send(request);
  ASSERT_TRUE(response.ok());
  EXPECT_EQ(response->status, 401);
}

TEST_F(SessionTest, A401ReauthenticatesOnceAndResends) {
  auto session = MakeSession();
  ASSERT_TRUE(session->CurrentToken().ok());
  ASSERT_TRUE(sim_->Admin("revoke_tokens").ok());
  auto leases = session->CallJson("reservation", "GET", "/v1/leases");
  ASSERT_TRUE(leases.ok()) << leases.status().ToString();
  EXPECT_EQ(TokenRequests(), 2);
  EXPECT_EQ(sim_->CountRequests("GET", "/blazar/v1/leases"), 2);
}

TEST_F(SessionTest, ASecond401InARowIsReported) {
  auto session = MakeSession();
  // The service rejects the fresh token too: report it rather than loop.
  ASSERT_TRUE(
      sim_->Admin("faults",
                  {{"method", "GET"}, {"path", "/blazar/v1/leases"}, {"status", 401}, {"count", 2}})
          .ok());
  auto leases = session->CallJson("reservation", "GET", "/v1/leases");
  ASSERT_FALSE(leases.ok());
  EXPECT_EQ(leases.status().code(), StatusCode::kUnauthenticated);
  EXPECT_EQ(TokenRequests(), 2);
}

TEST(CatalogTest, RegionInterfaceAndBlockStorageAliases) {
  json catalog = json::parse(R"([
    {"type": "volumev3", "endpoints": [
      {"interface": "public", "region_id": "CHI@UC", "url": "https://uc/volume"},
      {"interface": "public", "region_id": "CHI@TACC", "url": "https://tacc/volume"},
      {"interface": "internal", "region_id": "CHI@UC", "url": "http://internal/volume"}]},
    {"type": "compute", "endpoints": [
      {"interface": "public", "region": "CHI@UC", "url": "https://uc/compute"}]}])");
  auto parsed = Catalog::FromJson(catalog);
  ASSERT_TRUE(parsed.ok());
  EXPECT_EQ(*parsed->Url("block-storage", "public", "CHI@TACC"), "https://tacc/volume");
  EXPECT_EQ(*parsed->Url("volume", "internal", "CHI@UC"), "http://internal/volume");
  EXPECT_EQ(*parsed->Url("compute", "public", ""), "https://uc/compute");
  auto ambiguous = parsed->Url("volumev3", "public", "");
  ASSERT_FALSE(ambiguous.ok());
  EXPECT_NE(ambiguous.status().message().find("CHI@TACC, CHI@UC"), std::string::npos);
  auto missing = parsed->Url("reservation", "public", "CHI@UC");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().message(),
            "the service catalog has no public reservation endpoint in region CHI@UC; it offers: "
            "compute, volumev3");
  EXPECT_FALSE(Catalog::FromJson(json::parse(R"([{"type": 3}])")).ok());
}

TEST(ServiceMessageTest, ReadsEachServicesErrorShape) {
  auto message = [](const std::string& body) {
    http::Response response;
    response.body = body;
    return ServiceMessage(response);
  };
  EXPECT_EQ(message(R"({"error": {"code": 401, "title": "Unauthorized", "message": "no"}})"), "no");
  EXPECT_EQ(message(R"({"itemNotFound": {"code": 404, "message": "gone"}})"), "gone");
  EXPECT_EQ(message(R"({"NeutronError": {"type": "X", "message": "quota", "detail": ""}})"),
            "quota");
  EXPECT_EQ(message(R"({"error_code": 500, "error_message": "Not enough hosts available"})"),
            "Not enough hosts available");
  EXPECT_EQ(message("<html>Bad Gateway</html>"), "<html>Bad Gateway</html>");
}

}  // namespace
}  // namespace llmctl::openstack
