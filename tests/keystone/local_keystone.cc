#include "tests/keystone/local_keystone.h"

#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

namespace llmctl::testing {
namespace {

StatusOr<KeystoneInfo> ParseInfo(const std::string& line) {
  auto json = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (!json.is_object())
    return InternalError("keystone_local.py printed '" + line + "' instead of a JSON object");
  KeystoneInfo info;
  const std::vector<std::pair<const char*, std::string*>> strings = {
      {"auth_url", &info.auth_url},
      {"region", &info.region},
      {"username", &info.username},
      {"password", &info.password},
      {"project", &info.project},
      {"project_id", &info.project_id},
      {"user_domain", &info.user_domain},
      {"app_cred_id", &info.app_cred_id},
      {"app_cred_secret", &info.app_cred_secret},
      {"admin_password", &info.admin_password}};
  for (const auto& [key, field] : strings) {
    if (!json.contains(key) || !json[key].is_string() || json[key].get<std::string>().empty()) {
      return InternalError(std::string("keystone_local.py's JSON line has no string '") + key +
                           "'");
    }
    *field = json[key].get<std::string>();
  }
  for (const char* key : {"port", "pid"}) {
    if (!json.contains(key) || !json[key].is_number_integer() || json[key].get<int>() <= 0) {
      return InternalError(std::string("keystone_local.py's JSON line has no positive integer '") +
                           key + "'");
    }
  }
  info.port = json["port"].get<int>();
  info.uwsgi_pid = json["pid"].get<pid_t>();
  return info;
}

}  // namespace

StatusOr<std::unique_ptr<LocalKeystone>> LocalKeystone::Spawn(
    const std::string& dir, const std::vector<std::string>& args) {
  ASSIGN_OR_RETURN(std::unique_ptr<LocalScript> script,
                   LocalScript::Spawn("tests/keystone/keystone_local.py", dir, "keystone", args));
  return std::unique_ptr<LocalKeystone>(new LocalKeystone(std::move(script)));
}

StatusOr<KeystoneInfo> LocalKeystone::Wait(std::chrono::seconds timeout) {
  ASSIGN_OR_RETURN(std::string line, script_->WaitLine(timeout));
  return ParseInfo(line);
}

std::map<std::string, std::string> KeystoneInfo::PasswordEnvironment() const {
  return {{"OS_AUTH_URL", auth_url},
          {"OS_AUTH_TYPE", "password"},
          {"OS_USERNAME", username},
          {"OS_PASSWORD", password},
          {"OS_USER_DOMAIN_NAME", user_domain},
          {"OS_PROJECT_NAME", project},
          {"OS_PROJECT_DOMAIN_NAME", "Default"},
          {"OS_REGION_NAME", region},
          {"OS_INTERFACE", "public"},
          {"OS_IDENTITY_API_VERSION", "3"}};
}

std::map<std::string, std::string> KeystoneInfo::ApplicationCredentialEnvironment() const {
  return {{"OS_AUTH_URL", auth_url},
          {"OS_AUTH_TYPE", "v3applicationcredential"},
          {"OS_APPLICATION_CREDENTIAL_ID", app_cred_id},
          {"OS_APPLICATION_CREDENTIAL_SECRET", app_cred_secret},
          {"OS_REGION_NAME", region},
          {"OS_INTERFACE", "public"},
          {"OS_IDENTITY_API_VERSION", "3"}};
}

}  // namespace llmctl::testing
