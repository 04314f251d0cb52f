// Fuzz target for OpenStack credentials as the user gives them
// (controller/openstack/credentials.h): a clouds.yaml (CredentialsFromCloudsYaml, cloud
// "chameleon") or an openrc file's exports (CredentialsFromEnvironment over its NAME=VALUE lines,
// "export " and quotes as a shell leaves them). The first input byte picks which (even:
// clouds.yaml, odd: exports); the rest is the text. A user's file: credentials or a refusal, never
// a crash, an exception (yaml-cpp throws) or a hang.
//
// Beyond "no crash", the header's promises:
// - a refusal of a clouds.yaml is InvalidArgument or NotFound naming the file; of the exports,
//   InvalidArgument naming the variable (OS_...);
// - credentials taken are usable: auth_url is http(s) with something after the scheme, without a
//   trailing '/'; interface is public, internal or admin; and each auth type has what it needs (a
//   secret and a credential id or name, with its user when named; a user, a password and a
//   project; and for v3oidcpassword the identity provider, protocol, discovery endpoint and client
//   id);
// - the source names where they came from.
//
// The clouds.yaml is written to a file of its own in a temporary directory (/dev/shm when there
// is one), as the function reads a path. Replayed over tests/fuzz/corpus/clouds_yaml/ by the
// `clouds_yaml_fuzz_replay` test, with seeded mutations. To fuzz for real (clang with libFuzzer:
// apt-get install clang libclang-rt-14-dev), from the repository root, in bash:
//
//   SRCS="tests/fuzz/clouds_yaml_fuzz.cc controller/openstack/credentials.cc common/spelling.cc
//         common/status.cc common/files.cc common/yaml_document.cc common/home_directory.cc
//         common/errno_status.cc common/byte_size.cc common/text.cc common/atomic_file.cc"
//   clang++ -std=c++20 -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all
//       -I. $SRCS $(pkg-config --cflags --libs yaml-cpp) -o /tmp/clouds_yaml_fuzz   # one line
//   mkdir -p /tmp/clouds_yaml_corpus
//   /tmp/clouds_yaml_fuzz -max_total_time=300 -max_len=4096 -timeout=10
//       -dict=tests/fuzz/clouds_yaml_fuzz.dict /tmp/clouds_yaml_corpus
//       tests/fuzz/corpus/clouds_yaml                                             # one line
//
// Inputs that crash go into tests/fuzz/corpus/clouds_yaml/ with the fix.
#include <stdlib.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <string>
#include <string_view>

#include "controller/openstack/credentials.h"

namespace {

using llmctl::StatusCode;
using llmctl::openstack::AuthType;
using llmctl::openstack::Credentials;

void Check(bool condition) {
  if (!condition) std::abort();
}

// A directory of this process's own for the clouds.yaml, made once and removed at exit (a
// crash leaves it, with the input in it). In /dev/shm when there is one: every input is written
// there, and a disk's writes under a busy machine's load took most of the replay's time.
class TempCloudsYaml {
 public:
  TempCloudsYaml() {
    for (const std::string& parent :
         {std::string("/dev/shm"), std::filesystem::temp_directory_path().string()}) {
      std::string dir = parent + "/llmctl_clouds_yaml_fuzz_XXXXXX";
      if (::mkdtemp(dir.data()) != nullptr) {
        dir_ = dir;
        break;
      }
    }
    Check(!dir_.empty());
    path_ = dir_ + "/clouds.yaml";
  }
  ~TempCloudsYaml() {
    ::unlink(path_.c_str());
    ::rmdir(dir_.c_str());
  }
  const std::string& path() const { return path_; }

 private:
  std::string dir_, path_;
};

const std::string& CloudsYamlPath() {
  static const TempCloudsYaml file;
  return file.path();
}

void CheckUsable(const Credentials& creds) {
  // A scheme and something after it.
  Check((creds.auth_url.starts_with("https://") && creds.auth_url.size() > 8) ||
        (creds.auth_url.starts_with("http://") && creds.auth_url.size() > 7));
  Check(!creds.auth_url.ends_with('/'));
  Check(creds.interface == "public" || creds.interface == "internal" || creds.interface == "admin");
  const bool has_project = !creds.project_id.empty() || !creds.project_name.empty();
  switch (creds.auth_type) {
    case AuthType::kApplicationCredential:
      Check(!creds.application_credential_secret.empty());
      Check(!creds.application_credential_id.empty() ||
            (!creds.application_credential_name.empty() &&
             (!creds.user_id.empty() || !creds.username.empty())));
      break;
    case AuthType::kPassword:
      Check((!creds.username.empty() || !creds.user_id.empty()) && !creds.password.empty() &&
            has_project);
      break;
    case AuthType::kV3OidcPassword:
      Check(!creds.username.empty() && !creds.password.empty() && has_project &&
            !creds.identity_provider.empty() && !creds.protocol.empty() &&
            !creds.discovery_endpoint.empty() && !creds.client_id.empty());
      break;
  }
}

void CloudsYaml(std::string_view text) {
  const std::string& path = CloudsYamlPath();
  {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(text.data(), static_cast<std::streamsize>(text.size()));
    Check(out.good());
  }
  const llmctl::StatusOr<Credentials> creds =
      llmctl::openstack::CredentialsFromCloudsYaml("chameleon", {path});
  if (!creds.ok()) {
    Check(creds.status().code() == StatusCode::kInvalidArgument ||
          creds.status().code() == StatusCode::kNotFound);
    // The file's own messages begin with its path, Validate's with the source ("clouds.yaml PATH").
    Check(creds.status().message().starts_with(path) ||
          creds.status().message().starts_with("clouds.yaml " + path + ": "));
    return;
  }
  CheckUsable(*creds);
  Check(creds->source == "clouds.yaml " + path);
}

// NAME=VALUE lines as a shell leaves them after `source openrc`: "export " dropped, one pair of
// surrounding quotes removed.
std::map<std::string, std::string> Exports(std::string_view text) {
  std::map<std::string, std::string> env;
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string_view::npos) end = text.size();
    std::string_view line = text.substr(start, end - start);
    start = end + 1;
    if (line.starts_with("export ")) line.remove_prefix(7);
    const size_t equals = line.find('=');
    if (equals == std::string_view::npos) continue;
    std::string_view value = line.substr(equals + 1);
    if (value.size() >= 2 && (value.front() == '"' || value.front() == '\'') &&
        value.back() == value.front()) {
      value = value.substr(1, value.size() - 2);
    }
    env[std::string(line.substr(0, equals))] = std::string(value);
  }
  return env;
}

void Environment(std::string_view text) {
  const std::map<std::string, std::string> env = Exports(text);
  const llmctl::StatusOr<Credentials> creds = llmctl::openstack::CredentialsFromEnvironment(
      [&](const std::string& name) -> std::optional<std::string> {
        const auto it = env.find(name);
        if (it == env.end()) return std::nullopt;
        return it->second;
      });
  if (!creds.ok()) {
    Check(creds.status().code() == StatusCode::kInvalidArgument);
    Check(creds.status().message().starts_with("OS_"));
    return;
  }
  CheckUsable(*creds);
  Check(creds->source == "OS_* variables");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string_view text(reinterpret_cast<const char*>(data) + 1, size - 1);
  if (data[0] % 2 == 0) {
    CloudsYaml(text);
  } else {
    Environment(text);
  }
  return 0;
}
