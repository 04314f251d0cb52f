// llmctld's settings: built-in defaults, then a YAML config file, then LLMCTL_CONTROLLER, then
// flags.
//
//   # /etc/llmctl/controller.yaml
//   data_dir: /var/lib/llmctl
//   listen: unix:/var/lib/llmctl/controller.sock   # or 127.0.0.1:7070
//   allow_remote_listen: false   # true to listen on an address other than loopback
//   token_file: /etc/llmctl/api.token  # required with a TCP listen address: a 0600 file whose
//                                # token every call must carry ("authorization: Bearer TOKEN")
//   requeue_after: 10m           # an agent silent this long loses its running trials (requeued)
//   agent_call_deadline: 30s     # deadline of each unary call to an agent; an artifact download
//                                # is abandoned when the agent sends nothing for this long
//   min_transfer_rate: 10MiB     # per second: a blob upload to an agent may take
//                                # agent_call_deadline + its size at this rate (a 26 GB model
//                                # directory: ~42 min at 10 MiB/s)
//   health_interval: 5s          # how often each agent is asked for its node info
//
// LLMCTL_CONTROLLER says where the controller lives for the CLI and the daemon alike: an address
// ("unix:/path/controller.sock" or "host:port"); for llmctld it overrides `listen`.
// LLMCTL_CONTROLLER_TOKEN_FILE likewise names the API token file for both; for llmctld it
// overrides `token_file`. A unix socket needs no token (its 0700 mode and 0700 directory are the
// credential), so a unix listener ignores it.
#ifndef LLMCTL_CONTROLLER_CONFIG_H_
#define LLMCTL_CONTROLLER_CONFIG_H_

#include <chrono>
#include <optional>
#include <string>
#include <string_view>

#include "common/status.h"
#include "rpc/transfer.h"

namespace llmctl::controller {

struct ControllerConfig {
  std::string data_dir;  // absolute
  std::string listen;    // "unix:/abs/path" or "host:port"
  bool allow_remote_listen = false;
  std::string token_file;  // absolute; empty: none (refused with a TCP listen address)
  std::chrono::milliseconds requeue_after = std::chrono::minutes(10);
  std::chrono::milliseconds agent_call_deadline = std::chrono::seconds(30);
  int64_t min_transfer_bytes_per_second = rpc::kDefaultMinTransferBytesPerSecond;
  std::chrono::milliseconds health_interval = std::chrono::seconds(5);
};

// What the command line and the environment said; unset fields leave the layer below in place.
struct ControllerOverrides {
  std::optional<std::string> config_file = std::nullopt;
  std::optional<std::string> data_dir = std::nullopt;
  std::optional<std::string> listen = std::nullopt;
  std::optional<std::string> token_file = std::nullopt;
  bool allow_remote_listen = false;
  std::optional<std::string> env_controller = std::nullopt;  // LLMCTL_CONTROLLER
  std::optional<std::string> env_token_file = std::nullopt;  // LLMCTL_CONTROLLER_TOKEN_FILE
  std::optional<std::string> env_home = std::nullopt;        // HOME, for the default data directory
  std::optional<std::string> env_xdg_data_home = std::nullopt;
};

// The effective settings. The data directory defaults to $XDG_DATA_HOME/llmctl (else
// ~/.local/share/llmctl), the listen address to unix:<data_dir>/controller.sock. InvalidArgument
// naming the file, line and key for a bad config file; for a non-loopback listen address without
// allow_remote_listen; for a TCP listen address without a token file; for a relative data
// directory, socket path or token file.
StatusOr<ControllerConfig> ResolveControllerConfig(const ControllerOverrides& overrides);

// InvalidArgument when `config.listen` is TCP and no token file is set: every listener but the
// unix socket needs a credential.
Status CheckListenCredential(const ControllerConfig& config);

// Parses a config file's text over `config`; `filename` is for messages.
Status ApplyConfigYaml(std::string_view yaml_text, std::string_view filename,
                       ControllerConfig& config);

// The longest duration a setting takes: a year. The daemon adds each to the clocks' now, in
// nanoseconds, which a duration near int64's end of milliseconds (or of nanoseconds, 292 years)
// would overflow.
inline constexpr std::chrono::milliseconds kMaxDuration = std::chrono::hours(24 * 365);

// "500ms", "30s", "10m", "2h" → milliseconds. InvalidArgument for anything else, for 0 and for
// more than kMaxDuration.
StatusOr<std::chrono::milliseconds> ParseDuration(std::string_view text);

// Checks a listen address: "unix:/absolute/path", or "host:port" with a port of digits, 0..65535,
// where host must be loopback (127.0.0.1, ::1 as [::1], localhost) unless `allow_remote`.
Status ValidateListenAddress(std::string_view address, bool allow_remote);

// The socket path of a "unix:" address, nullopt for a TCP one.
std::optional<std::string> UnixSocketPath(std::string_view address);

}  // namespace llmctl::controller

#endif  // LLMCTL_CONTROLLER_CONFIG_H_
