// OpenStack credentials the way the openstack CLI takes them: OS_* variables (an openrc file's
// exports, unchanged) or a cloud in clouds.yaml (--os-cloud / OS_CLOUD).
#ifndef LLMCTL_CONTROLLER_OPENSTACK_CREDENTIALS_H_
#define LLMCTL_CONTROLLER_OPENSTACK_CREDENTIALS_H_

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"

namespace llmctl::openstack {

enum class AuthType {
  kApplicationCredential,  // "v3applicationcredential": the recommended path on Chameleon
  kPassword,               // "password" / "v3password": Keystone's own password method
  kV3OidcPassword,         // "v3oidcpassword": Chameleon's CLI password (OIDC + federation)
};

// Everything needed to get a token. Secret fields (password, application_credential_secret,
// client_secret) must never reach a message or a log: nothing in this library prints them.
struct Credentials {
  AuthType auth_type = AuthType::kApplicationCredential;
  std::string auth_url;     // Keystone v3, e.g. https://kvm.tacc.chameleoncloud.org:5000/v3
  std::string region_name;  // e.g. KVM@TACC; empty: the catalog must have one region per service
  std::string interface = "public";
  std::string cacert;  // CA bundle for TLS; empty: the system's

  std::string username, user_id, user_domain_name, user_domain_id, password;
  std::string project_id, project_name, project_domain_name, project_domain_id;
  std::string application_credential_id, application_credential_name, application_credential_secret;
  // v3oidcpassword
  std::string identity_provider, protocol, discovery_endpoint, client_id, client_secret;
  std::string openid_scope = "openid profile";

  // Where these came from ("OS_* variables", "clouds.yaml /path cloud 'x'"), for messages.
  std::string source;
};

// Reads a variable; nullopt when unset. A seam so tests need not touch the process environment.
using EnvLookup = std::function<std::optional<std::string>(const std::string& name)>;
EnvLookup ProcessEnvironment();

// From OS_AUTH_URL, OS_AUTH_TYPE, OS_USERNAME, OS_PASSWORD, OS_PROJECT_ID, OS_PROJECT_NAME,
// OS_*_DOMAIN_*, OS_APPLICATION_CREDENTIAL_*, OS_REGION_NAME, OS_INTERFACE, OS_CACERT and the OIDC
// ones (OS_IDENTITY_PROVIDER, OS_PROTOCOL, OS_DISCOVERY_ENDPOINT, OS_CLIENT_ID, OS_CLIENT_SECRET,
// OS_OPENID_SCOPE). InvalidArgument naming the missing or bad variable.
StatusOr<Credentials> CredentialsFromEnvironment(const EnvLookup& env);

// The files the openstack CLI searches, in its order: $OS_CLIENT_CONFIG_FILE when set,
// ./clouds.yaml, ~/.config/openstack/clouds.yaml (~ by common/home_directory.h's rule: HOME, else
// the password database's; left out when there is no home), /etc/openstack/clouds.yaml.
// InvalidArgument naming HOME when it is relative.
StatusOr<std::vector<std::string>> CloudsYamlSearchPath(const EnvLookup& env);

// Cloud `cloud` from the first file of `paths` that exists. NotFound when no file exists or the
// cloud is not in it (with the names that are); InvalidArgument naming file and key otherwise.
StatusOr<Credentials> CredentialsFromCloudsYaml(const std::string& cloud,
                                                const std::vector<std::string>& paths);

// `os_cloud`, else $OS_CLOUD, picks a clouds.yaml cloud; with neither, the OS_* variables.
StatusOr<Credentials> LoadCredentials(const std::string& os_cloud, const EnvLookup& env);

}  // namespace llmctl::openstack

#endif  // LLMCTL_CONTROLLER_OPENSTACK_CREDENTIALS_H_
