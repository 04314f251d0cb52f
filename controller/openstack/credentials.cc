#include "controller/openstack/credentials.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <string_view>

#include "common/files.h"
#include "common/home_directory.h"
#include "common/spelling.h"
#include "common/yaml_document.h"

namespace llmctl::openstack {
namespace {

struct AuthTypeName {
  std::string_view name;
  AuthType type;
};
constexpr AuthTypeName kAuthTypes[] = {
    {"v3applicationcredential", AuthType::kApplicationCredential},
    {"password", AuthType::kPassword},
    {"v3password", AuthType::kPassword},
    {"v3oidcpassword", AuthType::kV3OidcPassword},
};

StatusOr<AuthType> ParseAuthType(const std::string& text, const std::string& where) {
  std::vector<std::string_view> names;
  for (const auto& entry : kAuthTypes) {
    if (entry.name == text) return entry.type;
    names.push_back(entry.name);
  }
  std::string message = where + ": unsupported auth type '" + text + "'";
  std::string_view close = ClosestMatch(text, names);
  if (!close.empty()) message += " (did you mean '" + std::string(close) + "'?)";
  message += "; supported: v3applicationcredential, password, v3password, v3oidcpassword";
  return InvalidArgumentError(message);
}

// The field names shared by OS_<UPPER> variables and clouds.yaml's auth section.
struct Field {
  std::string_view key;  // clouds.yaml auth key; OS_ + upper case for the variable
  std::string Credentials::*member;
};
const Field kAuthFields[] = {
    {"auth_url", &Credentials::auth_url},
    {"username", &Credentials::username},
    {"user_id", &Credentials::user_id},
    {"user_domain_name", &Credentials::user_domain_name},
    {"user_domain_id", &Credentials::user_domain_id},
    {"password", &Credentials::password},
    {"project_id", &Credentials::project_id},
    {"project_name", &Credentials::project_name},
    {"project_domain_name", &Credentials::project_domain_name},
    {"project_domain_id", &Credentials::project_domain_id},
    {"application_credential_id", &Credentials::application_credential_id},
    {"application_credential_name", &Credentials::application_credential_name},
    {"application_credential_secret", &Credentials::application_credential_secret},
    {"identity_provider", &Credentials::identity_provider},
    {"protocol", &Credentials::protocol},
    {"discovery_endpoint", &Credentials::discovery_endpoint},
    {"client_id", &Credentials::client_id},
    {"client_secret", &Credentials::client_secret},
    {"openid_scope", &Credentials::openid_scope},
};

std::string EnvName(std::string_view key) {
  std::string name = "OS_";
  for (char c : key) name += static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return name;
}

// `describe(key)` says how the user spells a field in this source ("OS_AUTH_URL" or
// "clouds.x.auth.auth_url"), so a message points at the line to fix.
Status Validate(Credentials& creds, const std::function<std::string(std::string_view)>& describe) {
  auto missing = [&](std::string_view key, std::string_view why) {
    return InvalidArgumentError(creds.source + ": " + describe(key) + " is not set (" +
                                std::string(why) + ")");
  };
  if (creds.auth_url.empty()) return missing("auth_url", "Keystone's v3 URL");
  const std::string given = creds.auth_url;
  while (creds.auth_url.ends_with('/')) creds.auth_url.pop_back();
  // Checked after the trailing slashes go: "https:///" passed as a URL and was kept as "https:".
  const std::string_view url = creds.auth_url;
  if (!(url.starts_with("https://") && url.size() > 8) &&
      !(url.starts_with("http://") && url.size() > 7)) {
    return InvalidArgumentError(creds.source + ": " + describe("auth_url") + " '" + given +
                                "' is not an http(s) URL");
  }
  if (creds.interface != "public" && creds.interface != "internal" && creds.interface != "admin") {
    return InvalidArgumentError(creds.source + ": interface '" + creds.interface +
                                "' is not one of public, internal, admin");
  }
  bool has_project = !creds.project_id.empty() || !creds.project_name.empty();
  switch (creds.auth_type) {
    case AuthType::kApplicationCredential:
      if (creds.application_credential_secret.empty()) {
        return missing("application_credential_secret", "the application credential's secret");
      }
      if (creds.application_credential_id.empty() && creds.application_credential_name.empty()) {
        return missing("application_credential_id", "or application_credential_name");
      }
      if (creds.application_credential_id.empty() && creds.user_id.empty() &&
          creds.username.empty()) {
        return missing("user_id", "a credential named by name needs its user");
      }
      break;
    case AuthType::kPassword:
      if (creds.username.empty() && creds.user_id.empty()) return missing("username", "or user_id");
      if (creds.password.empty()) return missing("password", "the user's password");
      if (!has_project) return missing("project_id", "or project_name: the project to work in");
      break;
    case AuthType::kV3OidcPassword:
      if (creds.username.empty()) return missing("username", "the Chameleon login");
      if (creds.password.empty()) return missing("password", "the Chameleon CLI password");
      if (!has_project) return missing("project_id", "or project_name: the project to work in");
      if (creds.identity_provider.empty()) return missing("identity_provider", "e.g. chameleon");
      if (creds.protocol.empty()) return missing("protocol", "e.g. openid");
      if (creds.discovery_endpoint.empty()) {
        return missing("discovery_endpoint", "the OpenID Connect discovery document's URL");
      }
      if (creds.client_id.empty())
        return missing("client_id", "the OIDC client, e.g. keystone-kvm-prod");
      break;
  }
  return Status::Ok();
}

AuthType InferAuthType(const Credentials& creds) {
  return creds.application_credential_id.empty() && creds.application_credential_name.empty()
             ? AuthType::kPassword
             : AuthType::kApplicationCredential;
}

// "PATH:LINE" of `node` in the clouds.yaml at `path`.
std::string LineOf(const std::string& path, const YAML::Node& node) {
  return path + ":" + std::to_string(node.Mark().line + 1);
}

// The first of `paths` that is a regular file. NotFound naming every path searched.
StatusOr<std::string> FindCloudsYaml(const std::string& cloud,
                                     const std::vector<std::string>& paths) {
  for (const std::string& candidate : paths) {
    std::error_code error;
    if (std::filesystem::is_regular_file(candidate, error)) return candidate;
  }
  std::string searched;
  for (const std::string& candidate : paths) {
    searched += (searched.empty() ? "" : ", ") + candidate;
  }
  return NotFoundError("no clouds.yaml for cloud '" + cloud + "' (searched " + searched + ")");
}

// A mapping's key: its name and its node (where it is in the file).
struct Key {
  std::string name;
  YAML::Node node;
};

// A mapping's keys, each a scalar; InvalidArgument naming the line of one that is not (a list or a
// mapping used as a key).
StatusOr<std::vector<Key>> KeysOf(const YAML::Node& mapping, const std::string& path,
                                  const std::string& what) {
  std::vector<Key> keys;
  for (const auto& item : mapping) {
    if (!item.first.IsScalar()) {
      return InvalidArgumentError(LineOf(path, item.first) + ": a key of " + what +
                                  " is not a name");
    }
    keys.push_back({item.first.Scalar(), item.first});
  }
  return keys;
}

// `cloud`'s entry of the clouds.yaml at `path`, a mapping. Errors name the file (and the line).
StatusOr<YAML::Node> LoadCloudEntry(const std::string& path, const std::string& cloud) {
  ASSIGN_OR_RETURN(const std::string text, ReadFileToString(path, kMaxYamlSettingsBytes));
  ASSIGN_OR_RETURN(const YAML::Node root, LoadYamlSettings(text, path));
  const YAML::Node clouds = root.IsMap() ? root["clouds"] : YAML::Node();
  if (!clouds || !clouds.IsMap()) {
    return InvalidArgumentError(path + ": no 'clouds' mapping at the top level");
  }
  ASSIGN_OR_RETURN(const std::vector<Key> keys, KeysOf(clouds, path, "'clouds'"));
  const YAML::Node entry = clouds[cloud];
  if (!entry) {
    std::vector<std::string_view> names;
    std::string list;
    for (const Key& key : keys) {
      names.push_back(key.name);
      list += (list.empty() ? "" : ", ") + key.name;
    }
    std::string message = path + ": no cloud named '" + cloud + "'";
    std::string_view close = ClosestMatch(cloud, names);
    if (!close.empty()) message += " (did you mean '" + std::string(close) + "'?)";
    return NotFoundError(message + "; clouds there: " + (list.empty() ? "none" : list));
  }
  if (!entry.IsMap()) {
    return InvalidArgumentError(LineOf(path, entry) + ": clouds." + cloud + " must be a mapping");
  }
  return entry;
}

// `node`'s `key` into `out` when it is there; InvalidArgument naming the line when it is not a
// string.
Status ReadScalar(const YAML::Node& node, const std::string& key, const std::string& path,
                  std::string& out) {
  const YAML::Node value = node[key];
  if (!value) return Status::Ok();
  if (!value.IsScalar())
    return InvalidArgumentError(LineOf(path, value) + ": " + key + " must be a string");
  out = value.Scalar();
  return Status::Ok();
}

// The cloud's auth mapping (`auth`, absent or a mapping) into `creds`: each of kAuthFields that is
// there; a key that is none of them is refused, naming its line and the nearest known key.
Status ReadAuth(const YAML::Node& auth, const std::string& path, const std::string& prefix,
                Credentials& creds) {
  if (!auth) return Status::Ok();
  if (!auth.IsMap()) return InvalidArgumentError(path + ": " + prefix + ".auth must be a mapping");
  std::vector<std::string_view> known;
  for (const Field& field : kAuthFields) {
    known.push_back(field.key);
    RETURN_IF_ERROR(ReadScalar(auth, std::string(field.key), path, creds.*field.member));
  }
  ASSIGN_OR_RETURN(const std::vector<Key> keys, KeysOf(auth, path, prefix + ".auth"));
  for (const Key& key : keys) {
    if (std::find(known.begin(), known.end(), key.name) != known.end()) continue;
    std::string message = LineOf(path, key.node) + ": " + prefix + ".auth." + key.name +
                          " is not a supported auth key";
    std::string_view close = ClosestMatch(key.name, known);
    if (!close.empty()) message += " (did you mean '" + std::string(close) + "'?)";
    return InvalidArgumentError(message);
  }
  return Status::Ok();
}

}  // namespace

EnvLookup ProcessEnvironment() {
  return [](const std::string& name) -> std::optional<std::string> {
    const char* value = std::getenv(name.c_str());
    if (value == nullptr) return std::nullopt;
    return std::string(value);
  };
}

StatusOr<Credentials> CredentialsFromEnvironment(const EnvLookup& env) {
  Credentials creds;
  creds.source = "OS_* variables";
  for (const Field& field : kAuthFields) {
    if (auto value = env(EnvName(field.key)); value && !value->empty()) {
      creds.*field.member = *value;
    }
  }
  if (auto value = env("OS_REGION_NAME")) creds.region_name = *value;
  if (auto value = env("OS_INTERFACE"); value && !value->empty()) creds.interface = *value;
  if (auto value = env("OS_CACERT")) creds.cacert = *value;
  if (auto version = env("OS_IDENTITY_API_VERSION"); version && *version != "3") {
    return InvalidArgumentError("OS_IDENTITY_API_VERSION is '" + *version +
                                "'; only Keystone v3 is supported");
  }
  if (auto type = env("OS_AUTH_TYPE"); type && !type->empty()) {
    ASSIGN_OR_RETURN(creds.auth_type, ParseAuthType(*type, "OS_AUTH_TYPE"));
  } else {
    creds.auth_type = InferAuthType(creds);
  }
  RETURN_IF_ERROR(Validate(creds, [](std::string_view key) { return EnvName(key); }));
  return creds;
}

StatusOr<std::vector<std::string>> CloudsYamlSearchPath(const EnvLookup& env) {
  std::vector<std::string> paths;
  if (auto file = env("OS_CLIENT_CONFIG_FILE"); file && !file->empty()) paths.push_back(*file);
  paths.push_back("clouds.yaml");
  // Without a home (NotFound) there is no user's file to search; a relative HOME is refused.
  if (StatusOr<std::filesystem::path> home = HomeDirectory(env("HOME")); home.ok()) {
    paths.push_back((*home / ".config" / "openstack" / "clouds.yaml").string());
  } else if (home.status().code() != StatusCode::kNotFound) {
    return home.status();
  }
  paths.push_back("/etc/openstack/clouds.yaml");
  return paths;
}

StatusOr<Credentials> CredentialsFromCloudsYaml(const std::string& cloud,
                                                const std::vector<std::string>& paths) {
  ASSIGN_OR_RETURN(const std::string path, FindCloudsYaml(cloud, paths));
  ASSIGN_OR_RETURN(const YAML::Node entry, LoadCloudEntry(path, cloud));
  Credentials creds;
  creds.source = "clouds.yaml " + path;
  const std::string prefix = "clouds." + cloud;
  RETURN_IF_ERROR(ReadAuth(entry["auth"], path, prefix, creds));
  RETURN_IF_ERROR(ReadScalar(entry, "region_name", path, creds.region_name));
  RETURN_IF_ERROR(ReadScalar(entry, "interface", path, creds.interface));
  RETURN_IF_ERROR(ReadScalar(entry, "cacert", path, creds.cacert));
  std::string version;
  RETURN_IF_ERROR(ReadScalar(entry, "identity_api_version", path, version));
  if (!version.empty() && version != "3") {
    return InvalidArgumentError(path + ": " + prefix + ".identity_api_version is '" + version +
                                "'; only Keystone v3 is supported");
  }
  std::string auth_type;
  RETURN_IF_ERROR(ReadScalar(entry, "auth_type", path, auth_type));
  if (!auth_type.empty()) {
    ASSIGN_OR_RETURN(creds.auth_type,
                     ParseAuthType(auth_type, path + ": " + prefix + ".auth_type"));
  } else {
    creds.auth_type = InferAuthType(creds);
  }
  RETURN_IF_ERROR(
      Validate(creds, [&](std::string_view key) { return prefix + ".auth." + std::string(key); }));
  return creds;
}

StatusOr<Credentials> LoadCredentials(const std::string& os_cloud, const EnvLookup& env) {
  std::string cloud = os_cloud;
  if (cloud.empty()) {
    if (auto value = env("OS_CLOUD")) cloud = *value;
  }
  if (cloud.empty()) return CredentialsFromEnvironment(env);
  ASSIGN_OR_RETURN(const std::vector<std::string> paths, CloudsYamlSearchPath(env));
  return CredentialsFromCloudsYaml(cloud, paths);
}

}  // namespace llmctl::openstack
