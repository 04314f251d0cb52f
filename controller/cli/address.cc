#include "controller/cli/address.h"

#include <yaml-cpp/yaml.h>

#include <cstdlib>
#include <system_error>

#include "common/files.h"
#include "common/home_directory.h"
#include "common/text.h"
#include "common/yaml_document.h"

namespace llmctl::cli {
namespace {

namespace fs = std::filesystem;

std::string Position(const fs::path& file, const YAML::Mark& mark) {
  return file.string() + ":" + std::to_string(mark.line + 1) + ":" +
         std::to_string(mark.column + 1);
}

bool IsPort(std::string_view text) {
  if (text.empty() || text.size() > 5) return false;
  int port = 0;
  for (char c : text) {
    if (c < '0' || c > '9') return false;
    port = port * 10 + (c - '0');
  }
  return port >= 1 && port <= 65535;
}

// The XDG base directory spec: "If an implementation encounters a relative path in any of these
// variables it should consider the path invalid and ignore it."
bool IsXdgBaseDir(const std::string& value) { return fs::path(value).is_absolute(); }

struct ConfigFile {
  std::optional<std::string> controller;
  std::optional<fs::path> token_file;
};

StatusOr<ConfigFile> ReadConfigFile(const fs::path& path) {
  std::error_code error;
  if (!fs::exists(path, error)) return ConfigFile{};
  ASSIGN_OR_RETURN(std::string text, ReadFileToString(path.string(), kMaxYamlSettingsBytes));
  ASSIGN_OR_RETURN(const YAML::Node root, LoadYamlSettings(text, path.string()));
  if (root.IsNull()) return ConfigFile{};
  if (!root.IsMap()) {
    return InvalidArgumentError(
        Position(path, root.Mark()) +
        ": expected a map such as 'controller: unix:/path/controller.sock'");
  }
  ConfigFile config;
  for (auto it = root.begin(); it != root.end(); ++it) {
    const std::string key = it->first.IsScalar() ? it->first.Scalar() : "";
    const std::string where = Position(path, it->second.Mark());
    if (key == "controller") {
      if (!it->second.IsScalar() || it->second.Scalar().empty()) {
        return InvalidArgumentError(where + ": controller: expected unix:/path or host:port");
      }
      config.controller = it->second.Scalar();
      RETURN_IF_ERROR(CheckControllerTarget(*config.controller, where));
    } else if (key == "token_file") {
      if (!it->second.IsScalar() || !fs::path(it->second.Scalar()).is_absolute()) {
        return InvalidArgumentError(where +
                                    ": token_file: expected the absolute path of a 0600 file");
      }
      config.token_file = it->second.Scalar();
    } else {
      return InvalidArgumentError(Position(path, it->first.Mark()) + ": unknown key '" + key +
                                  "' (the keys are 'controller' and 'token_file')");
    }
  }
  return config;
}

// ConfigFilePath, or why there is none: HomeDirectory's error.
StatusOr<fs::path> ConfigFileLocation(const EnvLookup& env) {
  if (std::optional<std::string> xdg = env("XDG_CONFIG_HOME"); xdg && IsXdgBaseDir(*xdg)) {
    return fs::path(*xdg) / "llmctl" / "config.yaml";
  }
  ASSIGN_OR_RETURN(const fs::path home, HomeDirectory(env("HOME")));
  return home / ".config" / "llmctl" / "config.yaml";
}

}  // namespace

EnvLookup ProcessEnvironment() {
  return [](std::string_view name) -> std::optional<std::string> {
    const char* value = std::getenv(std::string(name).c_str());
    if (value == nullptr || *value == '\0') return std::nullopt;
    return std::string(value);
  };
}

Status CheckControllerTarget(std::string_view target, std::string_view where) {
  const std::string problem =
      std::string(where) + ": controller address '" + std::string(target) + "' ";
  if (target.starts_with("unix:")) {
    if (!fs::path(std::string(target.substr(5))).is_absolute()) {
      return InvalidArgumentError(problem + "names no absolute socket path (unix:/path/to.sock)");
    }
    return Status::Ok();
  }
  const size_t colon = target.rfind(':');
  if (colon == std::string_view::npos || colon == 0 || !IsPort(target.substr(colon + 1))) {
    return InvalidArgumentError(problem + "is neither unix:/path nor host:port (port 1-65535)");
  }
  const std::string_view host = target.substr(0, colon);
  if (host.find(':') != std::string_view::npos && !(host.front() == '[' && host.back() == ']')) {
    return InvalidArgumentError(problem + "has an IPv6 host without brackets ([::1]:port)");
  }
  return Status::Ok();
}

StatusOr<fs::path> EmbeddedDataDir(const EnvLookup& env) {
  // `shown` names the value for messages: "NAME='value'".
  auto usable = [](const std::string& shown, const std::string& value) -> StatusOr<fs::path> {
    if (!fs::path(value).is_absolute()) {
      return InvalidArgumentError(shown + " is not an absolute path");
    }
    // The daemons' socket addresses are below it, and proto3 strings carry them.
    if (FirstInvalidUtf8(value) != std::string::npos) {
      return InvalidArgumentError(shown +
                                  " is not UTF-8 text, which the embedded daemons' socket "
                                  "addresses below it must be (set LLMCTL_HOME to one that is)");
    }
    return fs::path(value);
  };
  if (std::optional<std::string> home = env("LLMCTL_HOME")) {
    // "/path/" names /path. Kept, EnsureOwnDirectory made /path as the parent of "/path/", with
    // the umask's mode instead of 0700, and llmctld refused the directory as open to others.
    while (home->size() > 1 && home->back() == '/') home->pop_back();
    return usable("LLMCTL_HOME='" + *home + "'", *home);
  }
  if (std::optional<std::string> xdg = env("XDG_DATA_HOME"); xdg && IsXdgBaseDir(*xdg)) {
    ASSIGN_OR_RETURN(fs::path base, usable("XDG_DATA_HOME='" + *xdg + "'", *xdg));
    return base / "llmctl";
  }
  const std::optional<std::string> home_variable = env("HOME");
  StatusOr<fs::path> home = HomeDirectory(home_variable);
  if (home.status().code() == StatusCode::kNotFound) {
    return InvalidArgumentError(home.status().message() +
                                ": cannot choose the data directory for the embedded controller "
                                "(set LLMCTL_HOME, or LLMCTL_CONTROLLER to use a running "
                                "controller)");
  }
  RETURN_IF_ERROR(home.status());
  // HomeDirectory gives HOME's value as it is, or the password database's home when HOME is
  // unset or empty.
  const std::string shown =
      std::string(home_variable && !home_variable->empty() ? "HOME='"
                                                           : "the password database's home '")
          .append(home->string())
          .append("'");
  ASSIGN_OR_RETURN(fs::path base, usable(shown, home->string()));
  return base / ".local" / "share" / "llmctl";
}

std::optional<fs::path> ConfigFilePath(const EnvLookup& env) {
  StatusOr<fs::path> path = ConfigFileLocation(env);
  if (!path.ok()) return std::nullopt;
  return *path;
}

StatusOr<ControllerAddress> ResolveControllerAddress(const EnvLookup& env) {
  std::optional<fs::path> env_token_file;
  if (std::optional<std::string> path = env("LLMCTL_CONTROLLER_TOKEN_FILE")) {
    if (!fs::path(*path).is_absolute()) {
      return InvalidArgumentError("LLMCTL_CONTROLLER_TOKEN_FILE='" + *path +
                                  "' is not an absolute path");
    }
    env_token_file = *path;
  }
  std::optional<std::string> env_target = env("LLMCTL_CONTROLLER");
  if (env_target) {
    RETURN_IF_ERROR(CheckControllerTarget(*env_target, "LLMCTL_CONTROLLER"));
  }
  // The environment alone decides for a unix socket (which takes no token) or when it names the
  // token file too: the config file is not read, so a mistake in it cannot get in the way.
  if (env_target && (env_target->starts_with("unix:") || env_token_file)) {
    return ControllerAddress{
        *env_target, "LLMCTL_CONTROLLER", false, {}, env_token_file.value_or(fs::path())};
  }
  // Without a home (NotFound) there is no config file to read; a relative HOME is refused.
  ConfigFile config;
  StatusOr<fs::path> config_path = ConfigFileLocation(env);
  if (config_path.ok()) {
    ASSIGN_OR_RETURN(config, ReadConfigFile(*config_path));
  } else if (config_path.status().code() != StatusCode::kNotFound) {
    return config_path.status();
  }
  const fs::path token_file = env_token_file.value_or(config.token_file.value_or(fs::path()));
  if (env_target) return ControllerAddress{*env_target, "LLMCTL_CONTROLLER", false, {}, token_file};
  if (config.controller) {
    return ControllerAddress{*config.controller, config_path->string(), false, {}, token_file};
  }
  ASSIGN_OR_RETURN(fs::path data_dir, EmbeddedDataDir(env));
  return ControllerAddress{"unix:" + (data_dir / "controller.sock").string(), "embedded", true,
                           data_dir, token_file};
}

}  // namespace llmctl::cli
