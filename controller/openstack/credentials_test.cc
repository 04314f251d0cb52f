#include "controller/openstack/credentials.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <utility>
#include <vector>

#include "common/home_directory.h"
#include "common/yaml_document.h"
#include "controller/openstack/sites.h"

namespace llmctl::openstack {
namespace {

EnvLookup Env(std::map<std::string, std::string> variables) {
  return [variables](const std::string& name) -> std::optional<std::string> {
    auto found = variables.find(name);
    if (found == variables.end()) return std::nullopt;
    return found->second;
  };
}

// Chameleon's openrc for KVM@TACC, exported unchanged.
std::map<std::string, std::string> ChameleonOpenrc() {
  return {{"OS_AUTH_URL", "https://kvm.tacc.chameleoncloud.org:5000/v3"},
          {"OS_IDENTITY_API_VERSION", "3"},
          {"OS_INTERFACE", "public"},
          {"OS_PROJECT_ID", "11b23a03af1b4fcbb16a21a86ce2a65d"},
          {"OS_USERNAME", "someone@example.edu"},
          {"OS_PROTOCOL", "openid"},
          {"OS_AUTH_TYPE", "v3oidcpassword"},
          {"OS_PASSWORD", "hunter2-secret"},
          {"OS_IDENTITY_PROVIDER", "chameleon"},
          {"OS_DISCOVERY_ENDPOINT",
           "https://auth.chameleoncloud.org/auth/realms/chameleon/.well-known/"
           "openid-configuration"},
          {"OS_CLIENT_ID", "keystone-kvm-prod"},
          {"OS_ACCESS_TOKEN_TYPE", "access_token"},
          {"OS_CLIENT_SECRET", "none"},
          {"OS_REGION_NAME", "KVM@TACC"}};
}

TEST(CredentialsFromEnvironmentTest, ReadsChameleonsOpenrcUnchanged) {
  auto creds = CredentialsFromEnvironment(Env(ChameleonOpenrc()));
  ASSERT_TRUE(creds.ok()) << creds.status().ToString();
  EXPECT_EQ(creds->auth_type, AuthType::kV3OidcPassword);
  EXPECT_EQ(creds->auth_url, "https://kvm.tacc.chameleoncloud.org:5000/v3");
  EXPECT_EQ(creds->region_name, "KVM@TACC");
  EXPECT_EQ(creds->identity_provider, "chameleon");
  EXPECT_EQ(creds->client_id, "keystone-kvm-prod");
  EXPECT_EQ(creds->project_id, "11b23a03af1b4fcbb16a21a86ce2a65d");
}

TEST(CredentialsFromEnvironmentTest, InfersApplicationCredentialWithoutAuthType) {
  auto creds = CredentialsFromEnvironment(Env({{"OS_AUTH_URL", "https://k:5000/v3/"},
                                               {"OS_APPLICATION_CREDENTIAL_ID", "id1"},
                                               {"OS_APPLICATION_CREDENTIAL_SECRET", "s"}}));
  ASSERT_TRUE(creds.ok()) << creds.status().ToString();
  EXPECT_EQ(creds->auth_type, AuthType::kApplicationCredential);
  EXPECT_EQ(creds->auth_url, "https://k:5000/v3");  // trailing slash dropped
}

// The trailing slashes used to go after the scheme was checked: "https:///" passed and was kept as
// "https:", a URL without a host (found by tests/fuzz/clouds_yaml_fuzz.cc).
TEST(CredentialsFromEnvironmentTest, AnAuthUrlOfOnlyASchemeIsRefused) {
  for (const char* url : {"https:///", "http://", "https://"}) {
    auto creds = CredentialsFromEnvironment(Env({{"OS_AUTH_URL", url},
                                                 {"OS_APPLICATION_CREDENTIAL_ID", "id1"},
                                                 {"OS_APPLICATION_CREDENTIAL_SECRET", "s"}}));
    ASSERT_FALSE(creds.ok()) << url << " kept as " << creds->auth_url;
    EXPECT_EQ(creds.status().code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(creds.status().message(),
              "OS_* variables: OS_AUTH_URL '" + std::string(url) + "' is not an http(s) URL");
  }
  auto kept = CredentialsFromEnvironment(Env({{"OS_AUTH_URL", "http://k//"},
                                              {"OS_APPLICATION_CREDENTIAL_ID", "id1"},
                                              {"OS_APPLICATION_CREDENTIAL_SECRET", "s"}}));
  ASSERT_TRUE(kept.ok()) << kept.status().ToString();
  EXPECT_EQ(kept->auth_url, "http://k");
}

TEST(CredentialsFromEnvironmentTest, NamesTheMissingVariable) {
  auto creds = CredentialsFromEnvironment(Env({{"OS_AUTH_URL", "https://k/v3"},
                                               {"OS_AUTH_TYPE", "password"},
                                               {"OS_USERNAME", "u"},
                                               {"OS_PASSWORD", "p"}}));
  ASSERT_FALSE(creds.ok());
  EXPECT_EQ(creds.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(creds.status().message(),
            "OS_* variables: OS_PROJECT_ID is not set (or project_name: the project to work in)");
  auto no_url = CredentialsFromEnvironment(Env({}));
  EXPECT_NE(no_url.status().message().find("OS_AUTH_URL is not set"), std::string::npos);
}

TEST(CredentialsFromEnvironmentTest, RejectsUnknownAuthTypeWithASuggestion) {
  auto env = ChameleonOpenrc();
  env["OS_AUTH_TYPE"] = "v3oidcpasword";
  auto creds = CredentialsFromEnvironment(Env(env));
  ASSERT_FALSE(creds.ok());
  EXPECT_NE(creds.status().message().find("did you mean 'v3oidcpassword'"), std::string::npos)
      << creds.status().message();
}

TEST(CredentialsFromEnvironmentTest, RejectsIdentityV2) {
  auto env = ChameleonOpenrc();
  env["OS_IDENTITY_API_VERSION"] = "2";
  EXPECT_FALSE(CredentialsFromEnvironment(Env(env)).ok());
}

class CloudsYamlTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("llmctl_clouds_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string Write(const std::string& name, const std::string& text) {
    std::filesystem::path path = dir_ / name;
    std::ofstream(path) << text;
    return path;
  }
  std::filesystem::path dir_;
};

TEST_F(CloudsYamlTest, ReadsTheFirstFileOfTheSearchPath) {
  std::string first = Write("first.yaml", R"(clouds:
  chi:
    auth:
      auth_url: https://chi.uc.chameleoncloud.org:5000/v3
      application_credential_id: abc
      application_credential_secret: xyz
    auth_type: v3applicationcredential
    region_name: CHI@UC
    interface: public
    identity_api_version: 3
)");
  std::string second = Write("second.yaml", "clouds: {}\n");
  auto creds = CredentialsFromCloudsYaml("chi", {(dir_ / "missing.yaml").string(), first, second});
  ASSERT_TRUE(creds.ok()) << creds.status().ToString();
  EXPECT_EQ(creds->auth_type, AuthType::kApplicationCredential);
  EXPECT_EQ(creds->application_credential_id, "abc");
  EXPECT_EQ(creds->region_name, "CHI@UC");
  EXPECT_EQ(creds->source, "clouds.yaml " + first);
}

TEST_F(CloudsYamlTest, UnknownCloudListsTheCloudsThere) {
  std::string path = Write("clouds.yaml", R"(clouds:
  kvm-tacc:
    auth: {auth_url: "https://x/v3", application_credential_id: a, application_credential_secret: b}
)");
  auto creds = CredentialsFromCloudsYaml("kvm-taac", {path});
  ASSERT_FALSE(creds.ok());
  EXPECT_EQ(creds.status().code(), StatusCode::kNotFound);
  EXPECT_EQ(creds.status().message(), path +
                                          ": no cloud named 'kvm-taac' (did you mean "
                                          "'kvm-tacc'?); clouds there: kvm-tacc");
}

TEST_F(CloudsYamlTest, UnknownAuthKeyNamesFileLineAndNearestKey) {
  std::string path = Write("clouds.yaml", R"(clouds:
  c:
    auth:
      auth_url: https://x/v3
      application_credential_secret: b
      aplication_credential_id: a
)");
  auto creds = CredentialsFromCloudsYaml("c", {path});
  ASSERT_FALSE(creds.ok());
  EXPECT_EQ(creds.status().message(),
            path +
                ":6: clouds.c.auth.aplication_credential_id is not a supported auth key (did "
                "you mean 'application_credential_id'?)");
}

TEST_F(CloudsYamlTest, MissingFieldNamesTheYamlKey) {
  std::string path = Write("clouds.yaml", R"(clouds:
  c:
    auth_type: password
    auth: {auth_url: "https://x/v3", username: u, project_name: p}
)");
  auto creds = CredentialsFromCloudsYaml("c", {path});
  ASSERT_FALSE(creds.ok());
  EXPECT_NE(creds.status().message().find("clouds.c.auth.password is not set"), std::string::npos)
      << creds.status().message();
}

TEST_F(CloudsYamlTest, BrokenYamlGivesLineAndColumn) {
  std::string path = Write("clouds.yaml", "clouds:\n  c: [unclosed\n");
  auto creds = CredentialsFromCloudsYaml("c", {path});
  ASSERT_FALSE(creds.ok());
  EXPECT_TRUE(creds.status().message().starts_with(path + ":")) << creds.status().message();
}

// yaml-cpp said "bad file" for nesting 500 deep, nothing counted the values it built nodes for
// (about 500 bytes each), and YAML::LoadFile read a file of any size.
TEST_F(CloudsYamlTest, AFileTooDeepOfTooManyValuesOrTooLargeIsRefusedNamingIt) {
  std::string many_values = "clouds: [0";
  for (int i = 0; i < 100'000; ++i) many_values += ",1";
  for (const auto& [text, reason] : std::vector<std::pair<std::string, std::string>>{
           {"clouds: " + std::string(600, '[') + std::string(600, ']') + "\n",
            ": lists and maps nested 500 levels deep, more than the YAML reader takes"},
           {many_values + "]\n", ": more than 100000 values (scalars, lists and maps) in one file"},
           {std::string(kMaxYamlSettingsBytes + 1, '#'), " is larger than 1048576 bytes"}}) {
    const std::string path = Write("clouds.yaml", text);
    const Status status = CredentialsFromCloudsYaml("c", {path}).status();
    EXPECT_EQ(status.message().rfind(path, 0), 0u) << status.message();
    EXPECT_NE(status.message().find(reason), std::string::npos) << status.message();
  }
}

// Every node of the file is checked for its shape before it is read: a file of another shape is
// refused naming the file and line, never taken for an internal error.
TEST_F(CloudsYamlTest, EachPartOfAnotherShapeIsRefusedNamingFileAndLine) {
  const auto refusal = [&](const std::string& text) {
    const std::string path = Write("clouds.yaml", text);
    auto creds = CredentialsFromCloudsYaml("chameleon", {path});
    EXPECT_FALSE(creds.ok()) << text;
    return creds.ok() ? std::string() : creds.status().message().substr(path.size());
  };
  EXPECT_EQ(refusal("- a list\n"), ": no 'clouds' mapping at the top level");
  EXPECT_EQ(refusal("just text\n"), ": no 'clouds' mapping at the top level");
  EXPECT_EQ(refusal(""), ": no 'clouds' mapping at the top level");
  EXPECT_EQ(refusal("clouds:\n  chameleon: 5\n"), ":2: clouds.chameleon must be a mapping");
  EXPECT_EQ(refusal("clouds:\n  chameleon: [a, b]\n"), ":2: clouds.chameleon must be a mapping");
  EXPECT_EQ(refusal("clouds:\n  ? [x]\n  : {auth: {}}\n"), ":2: a key of 'clouds' is not a name");
  EXPECT_EQ(refusal("clouds:\n  chameleon:\n    auth:\n      [a, b]: c\n"),
            ":4: a key of clouds.chameleon.auth is not a name");
  EXPECT_EQ(refusal("clouds:\n  chameleon:\n    auth: {auth_url: [1, 2]}\n"),
            ":3: auth_url must be a string");
  EXPECT_EQ(refusal("clouds:\n  chameleon:\n    region_name: {a: b}\n"),
            ":3: region_name must be a string");
}

TEST_F(CloudsYamlTest, NoFileAnywhereSaysWhereItLooked) {
  auto creds = CredentialsFromCloudsYaml("c", {(dir_ / "a.yaml").string()});
  ASSERT_FALSE(creds.ok());
  EXPECT_NE(creds.status().message().find("searched " + (dir_ / "a.yaml").string()),
            std::string::npos);
}

TEST(CloudsYamlSearchPathTest, FollowsTheOpenstackClientOrder) {
  EXPECT_EQ(*CloudsYamlSearchPath(Env({{"HOME", "/home/u"}})),
            (std::vector<std::string>{"clouds.yaml", "/home/u/.config/openstack/clouds.yaml",
                                      "/etc/openstack/clouds.yaml"}));
  EXPECT_EQ(CloudsYamlSearchPath(Env({{"OS_CLIENT_CONFIG_FILE", "/x.yaml"}}))->front(), "/x.yaml");
}

// The home directory by common/home_directory.h's rule, as llmctl's data directory and the token
// cache take it: the password database's when HOME is unset or empty (where ~/.config was left
// out), a relative HOME refused naming it (where it was searched below the current directory).
TEST(CloudsYamlSearchPathTest, HomeElseThePasswordDatabasesAndNeverARelativeHome) {
  const StatusOr<std::filesystem::path> entry = PasswordDatabaseHome(::getuid());
  ASSERT_TRUE(entry.ok()) << entry.status().ToString();
  const std::string users = (*entry / ".config" / "openstack" / "clouds.yaml").string();
  for (const EnvLookup& unset : {Env({}), Env({{"HOME", ""}})}) {
    EXPECT_EQ(*CloudsYamlSearchPath(unset),
              (std::vector<std::string>{"clouds.yaml", users, "/etc/openstack/clouds.yaml"}));
  }
  const Status refused = CloudsYamlSearchPath(Env({{"HOME", "home"}})).status();
  EXPECT_EQ(refused.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(refused.message(), HomeDirectory("home").status().message());
  EXPECT_EQ(LoadCredentials("c", Env({{"HOME", "home"}})).status().message(), refused.message());
}

TEST(LoadCredentialsTest, OsCloudPicksCloudsYaml) {
  auto creds = LoadCredentials("", Env({{"OS_CLOUD", "nowhere"}, {"HOME", "/nonexistent"}}));
  ASSERT_FALSE(creds.ok());
  EXPECT_NE(creds.status().message().find("no clouds.yaml for cloud 'nowhere'"), std::string::npos);
}

TEST(SitesTest, TableAndLookups) {
  auto kvm = FindSite("kvm@tacc");
  ASSERT_TRUE(kvm.ok());
  EXPECT_EQ(kvm->name, "KVM@TACC");
  EXPECT_EQ(kvm->auth_url, "https://kvm.tacc.chameleoncloud.org:5000/v3");
  EXPECT_EQ(kvm->kind, SiteKind::kKvm);
  auto typo = FindSite("CHI@UCC");
  ASSERT_FALSE(typo.ok());
  EXPECT_NE(typo.status().message().find("did you mean 'CHI@UC'"), std::string::npos);
  EXPECT_EQ(SiteForFlavor("g1.h100.pci.4"), "KVM@TACC");
  EXPECT_EQ(SiteForFlavor("baremetal"), "");
  EXPECT_EQ(SiteForAuthUrl("https://chi.uc.chameleoncloud.org:5000/v3/"), "CHI@UC");
  EXPECT_EQ(SiteForAuthUrl("http://127.0.0.1:5000/v3"), "");
}

}  // namespace
}  // namespace llmctl::openstack
