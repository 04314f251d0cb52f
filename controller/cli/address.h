// Where the controller is: LLMCTL_CONTROLLER, else the config file's `controller:`, else the
// embedded default (llmctl starts llmctld and a local agent in the user's data directory; see
// daemons.h). A controller on TCP also needs its API token: the 0600 file named by
// LLMCTL_CONTROLLER_TOKEN_FILE, else by the config file's `token_file:`.
#ifndef LLMCTL_CONTROLLER_CLI_ADDRESS_H_
#define LLMCTL_CONTROLLER_CLI_ADDRESS_H_

#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <string_view>

#include "common/status.h"

namespace llmctl::cli {

// Reads an environment variable; a seam so tests need not change the process's environment.
using EnvLookup = std::function<std::optional<std::string>(std::string_view name)>;

// The process's environment (getenv); empty values count as unset.
EnvLookup ProcessEnvironment();

struct ControllerAddress {
  std::string target;  // a gRPC target: "unix:/abs/path" or "host:port"
  std::string source;  // where it came from, for messages: "LLMCTL_CONTROLLER", the config file's
                       // path, or "embedded"
  bool embedded = false;
  std::filesystem::path data_dir;  // embedded only: the daemons' data directory
  // The controller's API token file (LLMCTL_CONTROLLER_TOKEN_FILE, else the config file's
  // `token_file`); empty when neither names one.
  std::filesystem::path token_file;
};

// Checks a controller address: "unix:/absolute/path" or "host:port" (port 1-65535, host not
// empty; "[::1]:port" for IPv6). InvalidArgument naming `where` and the value otherwise.
Status CheckControllerTarget(std::string_view target, std::string_view where);

// $LLMCTL_HOME (less a trailing slash), else ${XDG_DATA_HOME:-~/.local/share}/llmctl, a
// relative XDG_DATA_HOME ignored as the XDG base directory spec says, ~ the home directory by
// common/home_directory.h's rule (HOME, else the password database's). InvalidArgument when the
// one used is not absolute (a relative HOME included) or not UTF-8, or there is no home.
StatusOr<std::filesystem::path> EmbeddedDataDir(const EnvLookup& env);

// ${XDG_CONFIG_HOME:-~/.config}/llmctl/config.yaml, a relative XDG_CONFIG_HOME ignored, ~ as for
// EmbeddedDataDir; nullopt when there is no home or HOME is relative (for messages: the address
// itself refuses a relative HOME).
std::optional<std::filesystem::path> ConfigFilePath(const EnvLookup& env);

// LLMCTL_CONTROLLER, else the config file (a YAML map with the keys `controller` and
// `token_file`, an absolute path; a missing file, or no home to find it in, is no configuration),
// else the embedded default in EmbeddedDataDir. InvalidArgument for a bad address, token file
// path, HOME or config file ("FILE:LINE:COLUMN: problem" for the file).
StatusOr<ControllerAddress> ResolveControllerAddress(const EnvLookup& env);

}  // namespace llmctl::cli

#endif  // LLMCTL_CONTROLLER_CLI_ADDRESS_H_
