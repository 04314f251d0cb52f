#include "controller/cli/address.h"

#include <yaml-cpp/yaml.h>

#include <cstdlib>
#include <system_error>

#include "common/files.h"

namespace llmctl::cli {
namespace {

namespace fs = std::filesystem;

constexpr size_t kMaxConfigBytes = 1 << 20;

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

StatusOr<std::optional<std::string>> ReadConfigFile(const fs::path& path) {
  std::error_code error;
  if (!fs::exists(path, error)) return std::optional<std::string>();
  ASSIGN_OR_RETURN(std::string text, ReadFileToString(path.string(), kMaxConfigBytes));
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    return InvalidArgumentError(Position(path, e.mark) + ": " + e.msg);
  }
  if (root.IsNull()) return std::optional<std::string>();
  if (!root.IsMap()) {
    return InvalidArgumentError(
        Position(path, root.Mark()) +
        ": expected a map such as 'controller: unix:/path/controller.sock'");
  }
  std::optional<std::string> controller;
  for (auto it = root.begin(); it != root.end(); ++it) {
    const std::string key = it->first.IsScalar() ? it->first.Scalar() : "";
    if (key != "controller") {
      return InvalidArgumentError(Position(path, it->first.Mark()) + ": unknown key '" + key +
                                  "' (the only key is 'controller')");
    }
    if (!it->second.IsScalar() || it->second.Scalar().empty()) {
      return InvalidArgumentError(Position(path, it->second.Mark()) +
                                  ": controller: expected unix:/path or host:port");
    }
    controller = it->second.Scalar();
    RETURN_IF_ERROR(CheckControllerTarget(*controller, Position(path, it->second.Mark())));
  }
  return controller;
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
  auto absolute = [](const std::string& name, const std::string& value) -> StatusOr<fs::path> {
    if (!fs::path(value).is_absolute()) {
      return InvalidArgumentError(name + "='" + value + "' is not an absolute path");
    }
    return fs::path(value);
  };
  if (std::optional<std::string> home = env("LLMCTL_HOME")) return absolute("LLMCTL_HOME", *home);
  if (std::optional<std::string> xdg = env("XDG_DATA_HOME")) {
    ASSIGN_OR_RETURN(fs::path base, absolute("XDG_DATA_HOME", *xdg));
    return base / "llmctl";
  }
  std::optional<std::string> home = env("HOME");
  if (!home) {
    return InvalidArgumentError(
        "neither LLMCTL_HOME nor HOME is set: cannot choose the data directory for the embedded "
        "controller (set LLMCTL_HOME, or LLMCTL_CONTROLLER to use a running controller)");
  }
  ASSIGN_OR_RETURN(fs::path base, absolute("HOME", *home));
  return base / ".local" / "share" / "llmctl";
}

std::optional<fs::path> ConfigFilePath(const EnvLookup& env) {
  if (std::optional<std::string> xdg = env("XDG_CONFIG_HOME")) {
    return fs::path(*xdg) / "llmctl" / "config.yaml";
  }
  if (std::optional<std::string> home = env("HOME")) {
    return fs::path(*home) / ".config" / "llmctl" / "config.yaml";
  }
  return std::nullopt;
}

StatusOr<ControllerAddress> ResolveControllerAddress(const EnvLookup& env) {
  if (std::optional<std::string> target = env("LLMCTL_CONTROLLER")) {
    RETURN_IF_ERROR(CheckControllerTarget(*target, "LLMCTL_CONTROLLER"));
    return ControllerAddress{*target, "LLMCTL_CONTROLLER", false, {}};
  }
  if (std::optional<fs::path> config = ConfigFilePath(env)) {
    ASSIGN_OR_RETURN(std::optional<std::string> target, ReadConfigFile(*config));
    if (target) return ControllerAddress{*target, config->string(), false, {}};
  }
  ASSIGN_OR_RETURN(fs::path data_dir, EmbeddedDataDir(env));
  return ControllerAddress{"unix:" + (data_dir / "controller.sock").string(), "embedded", true,
                           data_dir};
}

}  // namespace llmctl::cli
