// `llmctl lease create|list|show|extend|delete`: the CLI's lease commands, callable from the
// llmctl binary (and tests) without a process of their own.
#ifndef LLMCTL_CONTROLLER_OPENSTACK_LEASE_CLI_H_
#define LLMCTL_CONTROLLER_OPENSTACK_LEASE_CLI_H_

#include <chrono>
#include <ostream>
#include <string>
#include <vector>

#include "common/http/http_client.h"
#include "common/status.h"
#include "controller/openstack/blazar.h"
#include "controller/openstack/cloud_clock.h"
#include "controller/openstack/credentials.h"
#include "controller/openstack/session.h"

namespace llmctl::openstack {

// Everything the commands take from outside their arguments; the defaults are the real world.
struct LeaseCommandContext {
  EnvLookup env = ProcessEnvironment();
  CloudClock* clock = &SystemCloudClock();
  http::ClientOptions http_options;
  SessionOptions session_options;
  BlazarOptions blazar_options;
  std::chrono::seconds wait_timeout{300};  // --wait: python-chi's 300 s after the start
};

// Runs one lease command; `args` are the words after "lease", e.g. {"create", "--flavor",
// "g1.h100.pci.1", "--wait"}. Tables and results go to `out`, errors (one line each) to `err`.
// Returns the exit code (CommandExitCode): 0 done, 1 the cloud refused or failed, 2 bad usage or
// input, 3 the cloud did not answer.
//
//   lease create (--flavor F | --node-type T [--hosts N]) [--site S] [--start T]
//                [--duration 2h50m] [--name N] [--wait] [--os-cloud C]
//   lease list | show NAME [--wait] | extend NAME --duration D | delete NAME      [--os-cloud C]
// --wait reports each status Blazar answers on its own line of `err` until the lease is ACTIVE.
int RunLeaseCommand(const std::vector<std::string>& args, std::ostream& out, std::ostream& err,
                    const LeaseCommandContext& context = {});

// Points `creds` at `site_name`'s Keystone when the site differs from the credentials' region.
// Only Chameleon's OIDC login works at every site; for other credentials FailedPrecondition says
// which to use instead. `why` names what chose the site ("--site CHI@UC", "flavor g1.h100.pci.1").
Status MoveCredentialsToSite(Credentials& creds, const std::string& site_name,
                             const std::string& why);

// The longest duration ParseDuration takes: a year. Blazar leases last days to weeks and each site
// enforces its own most (Blazar refuses longer ones itself), so this bound only catches what must
// be a typo ("999999d", 2700 years) before it is added to a start time: a TimePoint counts
// nanoseconds and ends in 2262, and a lease's start is at most year kMaxUtcYear (2199).
inline constexpr std::chrono::seconds kMaxLeaseDuration = std::chrono::days(365);

// "2h50m", "90m", "1d12h", "45s" → seconds. InvalidArgument quoting the text otherwise, also for
// zero and for more than kMaxLeaseDuration.
StatusOr<std::chrono::seconds> ParseDuration(std::string_view text);

}  // namespace llmctl::openstack

#endif  // LLMCTL_CONTROLLER_OPENSTACK_LEASE_CLI_H_
