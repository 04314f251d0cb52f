#include "controller/config.h"

#include <yaml-cpp/yaml.h>

#include <charconv>
#include <limits>

#include "common/byte_size.h"
#include "common/files.h"
#include "common/yaml_document.h"

namespace llmctl::controller {
namespace {

std::string Where(std::string_view filename, const YAML::Mark& mark) {
  return std::string(filename) + ":" + std::to_string(mark.line + 1) + ":" +
         std::to_string(mark.column + 1);
}

bool IsLoopbackHost(std::string_view host) {
  return host == "127.0.0.1" || host == "[::1]" || host == "localhost";
}

}  // namespace

StatusOr<std::chrono::milliseconds> ParseDuration(std::string_view text) {
  int64_t number = 0;
  const char* end = text.data() + text.size();
  auto [rest, error] = std::from_chars(text.data(), end, number);
  std::string_view unit(rest, end - rest);
  const auto bad = [&] {
    return InvalidArgumentError("expected a duration such as 500ms, 30s, 10m or 2h, got '" +
                                std::string(text) + "'");
  };
  if (error != std::errc() || rest == text.data() || number <= 0) return bad();
  int64_t unit_ms = 0;
  if (unit == "ms") {
    unit_ms = 1;
  } else if (unit == "s") {
    unit_ms = 1000;
  } else if (unit == "m") {
    unit_ms = 60'000;
  } else if (unit == "h") {
    unit_ms = 3'600'000;
  } else {
    return bad();
  }
  // Compared before multiplying, which could overflow.
  if (number > kMaxDuration.count() / unit_ms) {
    return InvalidArgumentError("expected a duration of at most " +
                                std::to_string(kMaxDuration.count() / 3'600'000) +
                                "h (a year), got '" + std::string(text) + "'");
  }
  return std::chrono::milliseconds(number * unit_ms);
}

std::optional<std::string> UnixSocketPath(std::string_view address) {
  constexpr std::string_view kPrefix = "unix:";
  if (!address.starts_with(kPrefix)) return std::nullopt;
  return std::string(address.substr(kPrefix.size()));
}

Status ValidateListenAddress(std::string_view address, bool allow_remote) {
  if (auto path = UnixSocketPath(address)) {
    if (path->empty() || path->front() != '/') {
      return InvalidArgumentError(
          "listen address '" + std::string(address) +
          "': a unix socket needs an absolute path (unix:/dir/controller.sock)");
    }
    return Status::Ok();
  }
  const size_t colon = address.rfind(':');
  if (colon == std::string_view::npos || colon == 0) {
    return InvalidArgumentError("listen address '" + std::string(address) +
                                "': expected unix:/path or host:port");
  }
  const std::string_view host = address.substr(0, colon);
  const std::string_view port_text = address.substr(colon + 1);
  int port = -1;
  auto [rest, error] = std::from_chars(port_text.data(), port_text.data() + port_text.size(), port);
  // Digits only: from_chars also reads "-0", which no listener takes.
  if (port_text.find_first_not_of("0123456789") != std::string_view::npos || error != std::errc() ||
      rest != port_text.data() + port_text.size() || port < 0 || port > 65535) {
    return InvalidArgumentError("listen address '" + std::string(address) +
                                "': the port must be a number from 0 to 65535");
  }
  if (!allow_remote && !IsLoopbackHost(host)) {
    return InvalidArgumentError(
        "listen address '" + std::string(address) +
        "' is not loopback: the API token travels without TLS, so the controller listens on a "
        "unix socket or 127.0.0.1 unless --allow-remote-listen (allow_remote_listen: true) says "
        "otherwise");
  }
  return Status::Ok();
}

Status CheckListenCredential(const ControllerConfig& config) {
  if (UnixSocketPath(config.listen) || !config.token_file.empty()) return Status::Ok();
  return InvalidArgumentError(
      "listen address '" + config.listen +
      "' is TCP, which any local account can reach: set token_file (--token-file, "
      "LLMCTL_CONTROLLER_TOKEN_FILE) to a 0600 file holding the API token (umask 077; openssl rand "
      "-hex 32 > FILE), or listen on a unix socket");
}

Status ApplyConfigYaml(std::string_view yaml_text, std::string_view filename,
                       ControllerConfig& config) {
  ASSIGN_OR_RETURN(const YAML::Node root, LoadYamlSettings(yaml_text, filename));
  if (root.IsNull()) return Status::Ok();
  if (!root.IsMap()) {
    return InvalidArgumentError(Where(filename, root.Mark()) +
                                ": expected a map of settings (listen, data_dir, ...)");
  }
  for (const auto& entry : root) {
    if (!entry.first.IsScalar()) {
      return InvalidArgumentError(Where(filename, entry.first.Mark()) +
                                  ": a setting's name is a list or a map, not a name");
    }
    const std::string key = entry.first.Scalar();
    const YAML::Node& value = entry.second;
    const std::string where = Where(filename, value.Mark()) + ": " + key;
    if (!value.IsScalar()) return InvalidArgumentError(where + ": expected a single value");
    const std::string text = value.Scalar();
    if (key == "data_dir") {
      config.data_dir = text;
    } else if (key == "listen") {
      config.listen = text;
    } else if (key == "token_file") {
      config.token_file = text;
    } else if (key == "allow_remote_listen") {
      if (text != "true" && text != "false") {
        return InvalidArgumentError(where + ": expected true or false, got '" + text + "'");
      }
      config.allow_remote_listen = text == "true";
    } else if (key == "requeue_after" || key == "agent_call_deadline" || key == "health_interval") {
      auto duration = ParseDuration(text);
      if (!duration.ok()) return InvalidArgumentError(where + ": " + duration.status().message());
      (key == "requeue_after"         ? config.requeue_after
       : key == "agent_call_deadline" ? config.agent_call_deadline
                                      : config.health_interval) = *duration;
    } else if (key == "min_transfer_rate") {
      StatusOr<uint64_t> rate = ParseByteSize(text);
      if (!rate.ok()) return InvalidArgumentError(where + ": " + rate.status().message());
      if (*rate == 0 || *rate > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        return InvalidArgumentError(where + ": expected a rate above 0 such as 10MiB, got '" +
                                    text + "'");
      }
      config.min_transfer_bytes_per_second = static_cast<int64_t>(*rate);
    } else {
      return InvalidArgumentError(
          Where(filename, entry.first.Mark()) + ": unknown setting '" + key +
          "' (known: data_dir, listen, allow_remote_listen, token_file, requeue_after, "
          "agent_call_deadline, min_transfer_rate, health_interval)");
    }
  }
  return Status::Ok();
}

StatusOr<ControllerConfig> ResolveControllerConfig(const ControllerOverrides& overrides) {
  ControllerConfig config;
  if (overrides.config_file) {
    ASSIGN_OR_RETURN(std::string text,
                     ReadFileToString(*overrides.config_file, kMaxYamlSettingsBytes));
    RETURN_IF_ERROR(ApplyConfigYaml(text, *overrides.config_file, config));
  }
  if (overrides.env_controller && !overrides.env_controller->empty()) {
    config.listen = *overrides.env_controller;
  }
  if (overrides.env_token_file && !overrides.env_token_file->empty()) {
    config.token_file = *overrides.env_token_file;
  }
  if (overrides.data_dir) config.data_dir = *overrides.data_dir;
  if (overrides.listen) config.listen = *overrides.listen;
  if (overrides.token_file) config.token_file = *overrides.token_file;
  if (overrides.allow_remote_listen) config.allow_remote_listen = true;

  if (config.data_dir.empty()) {
    if (overrides.env_xdg_data_home && !overrides.env_xdg_data_home->empty()) {
      config.data_dir = *overrides.env_xdg_data_home + "/llmctl";
    } else if (overrides.env_home && !overrides.env_home->empty()) {
      config.data_dir = *overrides.env_home + "/.local/share/llmctl";
    } else {
      return InvalidArgumentError(
          "no data directory: pass --data-dir or set data_dir in the config");
    }
  }
  if (config.data_dir.front() != '/') {
    return InvalidArgumentError("data directory '" + config.data_dir +
                                "' must be an absolute path");
  }
  if (config.listen.empty()) config.listen = "unix:" + config.data_dir + "/controller.sock";
  RETURN_IF_ERROR(ValidateListenAddress(config.listen, config.allow_remote_listen));
  if (!config.token_file.empty() && config.token_file.front() != '/') {
    return InvalidArgumentError("token file '" + config.token_file + "' must be an absolute path");
  }
  RETURN_IF_ERROR(CheckListenCredential(config));
  return config;
}

}  // namespace llmctl::controller
