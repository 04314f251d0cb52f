// The cloud client against a real Keystone (Debian's, OpenStack Zed) on 127.0.0.1, and the
// openstack CLI against the same Keystone, so the catalog the tests register is the format real
// clients read. One Keystone serves the whole binary (it takes 7-30 s to start on two shared
// cores); where it cannot start, every test fails with the reason: Keystone is among `make
// setup-tests`' packages, so a Keystone that does not start here is a fault to see, not a skip.
#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>

#include <chrono>
#include <filesystem>
#include <iostream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>

#include "common/http/http_client.h"
#include "controller/openstack/cloud_clock.h"
#include "controller/openstack/credentials.h"
#include "controller/openstack/session.h"
#include "tests/keystone/local_keystone.h"
#include "tests/support/shell_command.h"

namespace llmctl::testing {
namespace {

using openstack::Session;
using openstack::SessionOptions;
using openstack::TimePoint;
using namespace std::chrono_literals;

// Short, so that a test can wait until Keystone itself refuses a token.
constexpr auto kTokenExpiration = 4s;
// The services registered in the catalog. Nothing listens there: these tests only read the catalog.
constexpr char kServicesUrl[] = "http://127.0.0.1:9";
constexpr auto kStartTimeout = std::chrono::seconds(120);

std::string MakeTempDir() {
  std::string pattern =
      (std::filesystem::temp_directory_path() / "llmctl-keystone-XXXXXX").string();
  return mkdtemp(pattern.data()) ? pattern : "";
}

std::string Quote(const std::string& text) {
  std::string quoted = "'";
  for (char c : text) quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return quoted + "'";
}

// Time as the test sets it: the session's view of token lifetimes, apart from Keystone's own clock.
class ManualCloudClock : public openstack::CloudClock {
 public:
  explicit ManualCloudClock(TimePoint now) : now_(now) {}
  TimePoint Now() const override { return now_; }
  std::chrono::milliseconds SinceBoot() const override { return since_boot_; }
  void SleepFor(std::chrono::milliseconds duration) override {
    now_ += duration;
    since_boot_ += duration;
  }
  void Set(TimePoint now) { now_ = now; }

 private:
  TimePoint now_;
  std::chrono::milliseconds since_boot_{0};
};

// The JSON document `text` ends with (the openstack CLI may print warnings before it), or null.
nlohmann::json TrailingJson(const std::string& text) {
  for (size_t start = text.find_first_of("{["); start != std::string::npos;
       start = text.find_first_of("{[", start + 1)) {
    auto json = nlohmann::json::parse(text.substr(start), nullptr, /*allow_exceptions=*/false);
    if (!json.is_discarded()) return json;
  }
  return nullptr;
}

class KeystoneLiveTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::string(MakeTempDir());
    start_error_ = new std::string();
    if (dir_->empty()) {
      *start_error_ = "could not make a temporary directory";
      return;
    }
    const auto start = std::chrono::steady_clock::now();
    auto spawned =
        LocalKeystone::Spawn(*dir_, {"--token-expiration", std::to_string(kTokenExpiration.count()),
                                     "--services-url", kServicesUrl});
    if (!spawned.ok()) {
      *start_error_ = spawned.status().ToString();
      return;
    }
    keystone_ = spawned->release();
    auto info = keystone_->Wait(kStartTimeout);
    if (!info.ok()) {
      *start_error_ = "no local Keystone: " + info.status().ToString();
      return;
    }
    info_ = new KeystoneInfo(*info);
    std::cout << "Keystone served at " << info_->auth_url << " after "
              << std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count()
              << " s\n";
  }

  static void TearDownTestSuite() {
    if (keystone_ != nullptr) {
      Status stopped = keystone_->Stop();
      EXPECT_TRUE(stopped.ok()) << stopped.ToString();
      if (info_ != nullptr) {
        EXPECT_NE(kill(info_->uwsgi_pid, 0), 0) << "uwsgi's master outlived the stop";
      }
      delete keystone_;
      keystone_ = nullptr;
    }
    // Logs stay for a look when Keystone could not start or a test failed.
    if (!start_error_->empty() || ::testing::UnitTest::GetInstance()->failed_test_count() > 0) {
      std::cout << "Keystone's files and logs stay in " << *dir_ << "\n";
    } else if (!dir_->empty()) {
      std::filesystem::remove_all(*dir_);
    }
    delete info_;
    delete start_error_;
    delete dir_;
    info_ = nullptr;
  }

  void SetUp() override {
    ASSERT_NE(info_, nullptr) << "Keystone did not start: " << *start_error_;
  }

  // A session of the cloud client on `environment`'s credentials, read the way `llmctl` reads them.
  std::unique_ptr<Session> MakeSession(const std::map<std::string, std::string>& environment,
                                       SessionOptions options = {}) {
    auto credentials = openstack::CredentialsFromEnvironment(
        [environment](const std::string& name) -> std::optional<std::string> {
          auto found = environment.find(name);
          if (found == environment.end()) return std::nullopt;
          return found->second;
        });
    EXPECT_TRUE(credentials.ok()) << credentials.status().ToString();
    if (!credentials.ok()) return nullptr;
    return std::make_unique<Session>(*credentials, http_, clock_, options);
  }

  // `openstack ARGUMENTS -f json` with only `environment`'s OS_* variables; the JSON it printed.
  static nlohmann::json Openstack(const std::map<std::string, std::string>& environment,
                                  const std::string& arguments) {
    std::string command = "env -i PATH=\"$PATH\" HOME=" + Quote(*dir_);
    for (const auto& [name, value] : environment) command += " " + name + "=" + Quote(value);
    CommandResult result = RunShellCommand(command + " openstack " + arguments + " -f json");
    EXPECT_EQ(result.exit_code, 0) << result.out;
    return TrailingJson(result.out);
  }

  http::HttpClient http_;
  ManualCloudClock clock_{std::chrono::system_clock::now()};

  static std::string* dir_;
  static std::string* start_error_;
  static LocalKeystone* keystone_;
  static KeystoneInfo* info_;
};

std::string* KeystoneLiveTest::dir_ = nullptr;
std::string* KeystoneLiveTest::start_error_ = nullptr;
LocalKeystone* KeystoneLiveTest::keystone_ = nullptr;
KeystoneInfo* KeystoneLiveTest::info_ = nullptr;

TEST_F(KeystoneLiveTest, AuthenticatesWithThePassword) {
  const TimePoint before = std::chrono::system_clock::now();
  auto session = MakeSession(info_->PasswordEnvironment(), SessionOptions{.refresh_margin = 1s});
  ASSERT_NE(session, nullptr);
  auto token = session->CurrentToken();
  ASSERT_TRUE(token.ok()) << token.status().ToString();
  EXPECT_FALSE(token->id.empty());
  EXPECT_EQ(token->project_id, info_->project_id);
  // Keystone's "2026-11-22T05:39:39.000000Z" read as the right instant (seconds, UTC).
  EXPECT_GE(token->expires_at, before + kTokenExpiration - 2s);
  EXPECT_LE(token->expires_at, std::chrono::system_clock::now() + kTokenExpiration + 2s);
}

TEST_F(KeystoneLiveTest, AuthenticatesWithTheApplicationCredential) {
  auto session =
      MakeSession(info_->ApplicationCredentialEnvironment(), SessionOptions{.refresh_margin = 1s});
  ASSERT_NE(session, nullptr);
  auto token = session->CurrentToken();
  ASSERT_TRUE(token.ok()) << token.status().ToString();
  // The credential carries its project: the token is scoped to it without asking.
  EXPECT_EQ(token->project_id, info_->project_id);
}

TEST_F(KeystoneLiveTest, AWrongSecretIsRefusedWithoutBeingQuoted) {
  auto environment = info_->ApplicationCredentialEnvironment();
  const std::string wrong_secret = "not-the-secret-" + info_->app_cred_id;
  environment["OS_APPLICATION_CREDENTIAL_SECRET"] = wrong_secret;
  auto session = MakeSession(environment);
  ASSERT_NE(session, nullptr);
  auto token = session->CurrentToken();
  ASSERT_FALSE(token.ok());
  EXPECT_EQ(token.status().code(), StatusCode::kUnauthenticated) << token.status().ToString();
  EXPECT_NE(token.status().message().find(info_->auth_url), std::string::npos)
      << token.status().ToString();
  EXPECT_EQ(token.status().message().find(wrong_secret), std::string::npos)
      << token.status().ToString();
}

TEST_F(KeystoneLiveTest, FindsTheRegisteredEndpointsByTypeRegionAndInterface) {
  const std::string base = kServicesUrl;
  const std::string cinder =
      "/cinder/v3/" + info_->project_id;  // Keystone substitutes $(project_id)s
  struct Case {
    std::string region, interface, prefix;
  };
  // The public endpoints at the site, and the decoys keystone_local.py registers beside them.
  for (const Case& where :
       {Case{info_->region, "public", ""}, Case{info_->region, "internal", "/internal"},
        Case{"CHI@UC", "public", "/other-region"}}) {
    auto environment = info_->ApplicationCredentialEnvironment();
    environment["OS_REGION_NAME"] = where.region;
    environment["OS_INTERFACE"] = where.interface;
    auto session = MakeSession(environment, SessionOptions{.refresh_margin = 1s});
    ASSERT_NE(session, nullptr);
    const std::string url = base + where.prefix;
    // block-storage, volume and block-store are aliases of the volumev3 and block-storage types
    // registered.
    for (const auto& [type, expected] :
         std::vector<std::pair<std::string, std::string>>{{"reservation", url + "/blazar"},
                                                          {"compute", url + "/nova/v2.1"},
                                                          {"network", url + "/neutron"},
                                                          {"image", url + "/glance"},
                                                          {"volumev3", url + cinder},
                                                          {"block-storage", url + cinder},
                                                          {"volume", url + cinder},
                                                          {"block-store", url + cinder}}) {
      auto found = session->EndpointUrl(type);
      ASSERT_TRUE(found.ok()) << type << " in " << where.region << " ("
                              << where.interface << "): " << found.status().ToString();
      EXPECT_EQ(*found, expected) << type << " in " << where.region << " ("
                                  << where.interface << ")";
    }
  }
  auto session = MakeSession(info_->ApplicationCredentialEnvironment());
  ASSERT_NE(session, nullptr);
  auto missing = session->EndpointUrl("orchestration");
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound) << missing.status().ToString();
  EXPECT_NE(missing.status().message().find("reservation"), std::string::npos)
      << missing.status().ToString();
}

TEST_F(KeystoneLiveTest, ReissuesTheTokenWhenLessThanTheMarginIsLeft) {
  auto session =
      MakeSession(info_->ApplicationCredentialEnvironment(), SessionOptions{.refresh_margin = 2s});
  ASSERT_NE(session, nullptr);
  auto first = session->CurrentToken();
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  auto again = session->CurrentToken();
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(again->id, first->id) << "re-issued while the token had more than the margin left";

  clock_.Set(first->expires_at - 1s);
  auto renewed = session->CurrentToken();
  ASSERT_TRUE(renewed.ok()) << renewed.status().ToString();
  EXPECT_NE(renewed->id, first->id);
  EXPECT_EQ(renewed->project_id, info_->project_id);
}

TEST_F(KeystoneLiveTest, AuthenticatesAgainWhenKeystoneRefusesAnExpiredToken) {
  // The session's clock stands still, so only Keystone's 401 can tell it the token is gone.
  auto session =
      MakeSession(info_->ApplicationCredentialEnvironment(), SessionOptions{.refresh_margin = 1s});
  ASSERT_NE(session, nullptr);
  auto first = session->CurrentToken();
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  auto catalog = session->CallJson("identity", "GET", "/auth/catalog");
  ASSERT_TRUE(catalog.ok()) << catalog.status().ToString();

  std::this_thread::sleep_until(first->expires_at + 1500ms);  // Keystone's own clock: no other way
  catalog = session->CallJson("identity", "GET", "/auth/catalog");
  ASSERT_TRUE(catalog.ok()) << catalog.status().ToString();
  EXPECT_TRUE((*catalog)["catalog"].is_array()) << catalog->dump();
  auto renewed = session->CurrentToken();
  ASSERT_TRUE(renewed.ok()) << renewed.status().ToString();
  EXPECT_NE(renewed->id, first->id);
}

TEST_F(KeystoneLiveTest, OpenstackCliIssuesATokenWithTheApplicationCredential) {
  nlohmann::json token = Openstack(info_->ApplicationCredentialEnvironment(), "token issue");
  ASSERT_TRUE(token.is_object()) << token;
  EXPECT_EQ(token["project_id"], info_->project_id);
  EXPECT_FALSE(token["id"].get<std::string>().empty());
}

TEST_F(KeystoneLiveTest, OpenstackCliListsTheRegisteredCatalog) {
  nlohmann::json catalog = Openstack(info_->PasswordEnvironment(), "catalog list");
  ASSERT_TRUE(catalog.is_array()) << catalog;
  // What real clients read: each registered service with its public endpoint at the site, the
  // project id substituted into Cinder's URL.
  const std::string base = kServicesUrl;
  const std::vector<std::pair<std::string, std::string>> expected = {
      {"identity", info_->auth_url},
      {"reservation", base + "/blazar"},
      {"compute", base + "/nova/v2.1"},
      {"network", base + "/neutron"},
      {"volumev3", base + "/cinder/v3/" + info_->project_id},
      {"block-storage", base + "/cinder/v3/" + info_->project_id},
      {"image", base + "/glance"}};
  for (const auto& [type, url] : expected) {
    bool found = false;
    for (const auto& service : catalog) {
      if (service["Type"] != type) continue;
      for (const auto& endpoint : service["Endpoints"]) {
        found |= endpoint["interface"] == "public" && endpoint["region_id"] == info_->region &&
                 endpoint["url"] == url;
      }
    }
    EXPECT_TRUE(found) << type << " at " << url << " is not in " << catalog.dump(2);
  }
}

TEST_F(KeystoneLiveTest, StoppedWhileStartingLeavesNoProcessBehind) {
  const std::string dir = *dir_ + "/stopped-while-starting";
  std::filesystem::create_directory(dir);
  auto keystone = LocalKeystone::Spawn(dir, {});
  ASSERT_TRUE(keystone.ok()) << keystone.status().ToString();
  // Stop it once uwsgi and keystone-manage both run beside the script: the moment with the most to
  // end.
  const auto deadline = std::chrono::steady_clock::now() + kStartTimeout;
  while ((!std::filesystem::exists(dir + "/keystone/keystone-manage.log") ||
          ProcessesInSession((*keystone)->pid()).size() < 3) &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(20ms);
  }
  ASSERT_GE(ProcessesInSession((*keystone)->pid()).size(), 3u)
      << "expected the script, uwsgi, keystone-manage";
  Status stopped = (*keystone)->Stop();
  EXPECT_TRUE(stopped.ok()) << stopped.ToString();
  EXPECT_TRUE(ProcessesInSession((*keystone)->pid()).empty());
}

}  // namespace
}  // namespace llmctl::testing
