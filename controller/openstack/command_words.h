// The part every cloud command group (`llmctl lease ...`, `llmctl node ...`) shares: parsing its
// words with CLI11 and turning its outcome into the documented exit codes.
#ifndef LLMCTL_CONTROLLER_OPENSTACK_COMMAND_WORDS_H_
#define LLMCTL_CONTROLLER_OPENSTACK_COMMAND_WORDS_H_

#include <CLI/CLI.hpp>
#include <optional>
#include <ostream>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace llmctl::openstack {

// Parses `words` (those after "llmctl <group>") into `app`. Returns the exit code to stop with (0
// after printing the help, 2 after a usage error, named "llmctl <group>: ...") or nullopt to go on.
std::optional<int> ParseCommandWords(CLI::App& app, const std::vector<std::string>& words,
                                     std::string_view group, std::ostream& out, std::ostream& err);

// 0 when `status` is OK; otherwise prints "llmctl <group> <command>: <message>" and returns 2 for
// bad input (InvalidArgument), 3 when a service did not answer (Unavailable or DeadlineExceeded:
// the controller, or the cloud after the HTTP client's retries; trying again later may help), 1
// when the cloud refused or failed otherwise. The same codes as llmctl's other commands
// (controller/cli/commands.h).
int CommandExitCode(const Status& status, std::string_view group, std::string_view command,
                    std::ostream& err);

}  // namespace llmctl::openstack

#endif  // LLMCTL_CONTROLLER_OPENSTACK_COMMAND_WORDS_H_
