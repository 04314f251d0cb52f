#include "controller/openstack/lease_cli.h"

#include <CLI/CLI.hpp>
#include <algorithm>
#include <memory>
#include <optional>

#include "common/text.h"
#include "common/utc_time.h"
#include "controller/openstack/command_words.h"
#include "controller/openstack/nova.h"
#include "controller/openstack/sites.h"

namespace llmctl::openstack {
namespace {

constexpr char kDefaultDuration[] = "2h50m";  // the labs' lease length
constexpr char kTableDate[] = "%Y-%m-%d %H:%M";

struct LeaseFlags {
  std::string os_cloud;
  std::string flavor, node_type, site, start, duration = kDefaultDuration, name;
  int hosts = 1;
  bool wait = false;
  std::string lease;  // show / extend / delete
};

// The cloud objects one command needs, built once its arguments are known.
struct Cloud {
  std::unique_ptr<http::HttpClient> http;
  std::unique_ptr<Session> session;
  std::unique_ptr<BlazarClient> blazar;
};

StatusOr<Cloud> Connect(Credentials creds, const LeaseCommandContext& context) {
  Cloud cloud;
  http::ClientOptions options = context.http_options;
  if (!creds.cacert.empty()) options.ca_bundle_path = creds.cacert;
  cloud.http = std::make_unique<http::HttpClient>(options);
  cloud.session = std::make_unique<Session>(std::move(creds), *cloud.http, *context.clock,
                                            context.session_options);
  cloud.blazar =
      std::make_unique<BlazarClient>(*cloud.session, *context.clock, context.blazar_options);
  return cloud;
}

std::string Reserves(const Lease& lease) {
  std::string what;
  for (const Reservation& reservation : lease.reservations) {
    if (!what.empty()) what += ", ";
    what += DescribeReservation(reservation);
  }
  return what;
}

// Every word Blazar answers (names, statuses, ids, properties) is the cloud's, and anyone who can
// name a lease in a shared project chooses some of it: each cell and field goes through OnOneLine,
// so that no escape sequence of theirs reaches the terminal and no newline forges a line, cut to
// kMaxCellBytes in the table (a 5,000-byte name made every row that wide) and kMaxFieldBytes in a
// lease's own lines and --wait's progress.
constexpr size_t kMaxCellBytes = 128;  // two reservations' descriptions with their ids fit
constexpr size_t kMaxFieldBytes = 1024;

void PrintTable(const std::vector<Lease>& leases, std::ostream& out) {
  std::vector<std::vector<std::string>> rows = {
      {"NAME", "STATUS", "START (UTC)", "END (UTC)", "RESERVES", "ID"}};
  for (const Lease& lease : leases) {
    rows.push_back({OnOneLine(lease.name, kMaxCellBytes), OnOneLine(lease.status, kMaxCellBytes),
                    FormatUtc(lease.start, kTableDate), FormatUtc(lease.end, kTableDate),
                    OnOneLine(Reserves(lease), kMaxCellBytes), OnOneLine(lease.id, kMaxCellBytes)});
  }
  out << FormatColumns(rows);
}

void PrintLease(const Lease& lease, std::ostream& out) {
  out << "name:         " << OnOneLine(lease.name, kMaxFieldBytes) << "\n"
      << "id:           " << OnOneLine(lease.id, kMaxFieldBytes) << "\n"
      << "status:       " << OnOneLine(lease.status, kMaxFieldBytes) << "\n"
      << "start (UTC):  " << FormatUtc(lease.start, kTableDate) << "\n"
      << "end (UTC):    " << FormatUtc(lease.end, kTableDate) << "\n";
  for (const Reservation& reservation : lease.reservations) {
    // The line names the type: of a count of hosts or devices, the count and properties.
    const std::string what = reservation.min > 0 ? std::to_string(reservation.min) + " x " +
                                                       reservation.resource_properties
                                                 : DescribeReservation(reservation);
    out << "reservation:  "
        << OnOneLine(reservation.id + " " + reservation.resource_type + " " + reservation.status +
                         " (" + what + ")",
                     kMaxFieldBytes)
        << "\n";
  }
}

// InvalidArgument when a lease `what` describes would end after year kMaxUtcYear: Blazar could
// make it, but its dates would not parse back (ParseUtcTimestamp refuses them), so llmctl could
// neither show nor extend it.
Status CheckEnd(TimePoint end, const std::string& what) {
  const TimePoint first_too_late =
      std::chrono::sys_days(std::chrono::year(kMaxUtcYear + 1) / std::chrono::January / 1);
  if (end < first_too_late) return Status::Ok();
  return InvalidArgumentError(what + " ends after " + std::to_string(kMaxUtcYear) +
                              ", the last year llmctl reads a lease's dates in");
}

bool ValidNodeType(const std::string& text) {
  return !text.empty() && std::all_of(text.begin(), text.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.';
  });
}

// --wait: until the lease is ACTIVE, each status Blazar answers on its own line of `err`.
StatusOr<Lease> WaitUntilActive(BlazarClient& blazar, Lease lease, std::ostream& err,
                                const LeaseCommandContext& context) {
  return blazar.WaitUntilActive(std::move(lease), context.wait_timeout,
                                [&err](const std::string& line) {
                                  // The line quotes the lease's name and status, Blazar's words:
                                  // cut like a lease's own lines in show.
                                  err << OnOneLine(line, kMaxFieldBytes) << "\n" << std::flush;
                                });
}

Status RunCreate(const LeaseFlags& flags, std::ostream& out, std::ostream& err,
                 const LeaseCommandContext& context) {
  if (flags.flavor.empty() == flags.node_type.empty()) {
    return InvalidArgumentError(
        "lease create needs exactly one of --flavor (KVM sites) and "
        "--node-type (bare-metal sites)");
  }
  if (!flags.node_type.empty() && !ValidNodeType(flags.node_type)) {
    return InvalidArgumentError("--node-type '" + flags.node_type +
                                "' may hold only letters, digits, '_', '-' and '.'");
  }
  // Blazar takes the name in JSON text, which must be UTF-8 (nlohmann's dump throws otherwise).
  if (FirstInvalidUtf8(flags.name) != std::string::npos) {
    return InvalidArgumentError("--name '" + flags.name + "' is not UTF-8 text, as Blazar needs");
  }
  if (flags.hosts < 1) return InvalidArgumentError("--hosts must be at least 1");
  ASSIGN_OR_RETURN(std::chrono::seconds duration, ParseDuration(flags.duration));
  std::optional<TimePoint> start;
  if (!flags.start.empty() && flags.start != "now") {
    StatusOr<TimePoint> parsed = ParseUtcTimestamp(flags.start);
    if (!parsed.ok()) return parsed.status().WithContext("--start");
    if (*parsed < context.clock->Now() - std::chrono::minutes(1)) {
      return InvalidArgumentError("--start " + flags.start + " is in the past (times are UTC)");
    }
    start = *parsed;
  }
  const TimePoint begin = start.value_or(context.clock->Now());
  // Both bounded (begin by ParseUtcTimestamp or the clock, duration by ParseDuration), so the sum
  // stays inside a TimePoint; checked before anything is sent.
  const TimePoint end = begin + duration;
  RETURN_IF_ERROR(CheckEnd(end, (start ? "--start " + flags.start : std::string("now")) +
                                    " plus --duration " + flags.duration));
  ASSIGN_OR_RETURN(Credentials creds, LoadCredentials(flags.os_cloud, context.env));
  std::string site = flags.site;
  std::string why = "--site " + flags.site;
  if (site.empty() && !flags.flavor.empty()) {
    site = std::string(SiteForFlavor(flags.flavor));
    why = "flavor " + flags.flavor;
  }
  RETURN_IF_ERROR(MoveCredentialsToSite(creds, site, why));
  ASSIGN_OR_RETURN(Cloud cloud, Connect(std::move(creds), context));

  LeaseSpec spec;
  spec.start = start;
  spec.end = end;
  if (!flags.flavor.empty()) {
    NovaClient nova(*cloud.session, *context.clock);
    ASSIGN_OR_RETURN(Flavor flavor, nova.FindFlavor(flags.flavor));
    spec.flavor_id = flavor.id;
  } else {
    spec.node_type = flags.node_type;
    spec.hosts = flags.hosts;
  }
  // Deterministic, so re-running the same command in the same minute finds the first lease
  // instead of making a second one.
  spec.name = !flags.name.empty()
                  ? flags.name
                  : "llmctl-" + (flags.flavor.empty() ? flags.node_type : flags.flavor) + "-" +
                        FormatUtc(begin, "%Y%m%d-%H%M");
  ASSIGN_OR_RETURN(Lease lease, cloud.blazar->Create(spec));
  if (flags.wait) {
    ASSIGN_OR_RETURN(lease, WaitUntilActive(*cloud.blazar, std::move(lease), err, context));
  }
  PrintLease(lease, out);
  return Status::Ok();
}

Status RunOther(const std::string& command, const LeaseFlags& flags, std::ostream& out,
                std::ostream& err, const LeaseCommandContext& context) {
  ASSIGN_OR_RETURN(Credentials creds, LoadCredentials(flags.os_cloud, context.env));
  if (!flags.site.empty())
    RETURN_IF_ERROR(MoveCredentialsToSite(creds, flags.site, "--site " + flags.site));
  ASSIGN_OR_RETURN(Cloud cloud, Connect(std::move(creds), context));
  if (command == "list") {
    ASSIGN_OR_RETURN(std::vector<Lease> leases, cloud.blazar->List());
    PrintTable(leases, out);
  } else if (command == "show") {
    ASSIGN_OR_RETURN(Lease lease, cloud.blazar->Get(flags.lease));
    if (flags.wait) {
      ASSIGN_OR_RETURN(lease, WaitUntilActive(*cloud.blazar, std::move(lease), err, context));
    }
    PrintLease(lease, out);
  } else if (command == "extend") {
    ASSIGN_OR_RETURN(std::chrono::seconds duration, ParseDuration(flags.duration));
    ASSIGN_OR_RETURN(Lease current, cloud.blazar->Get(flags.lease));
    // current.end parsed from Blazar's answer, so at most year kMaxUtcYear: no overflow.
    const TimePoint end = current.end + duration;
    RETURN_IF_ERROR(
        CheckEnd(end, "lease '" + current.name + "' extended by --duration " + flags.duration));
    ASSIGN_OR_RETURN(Lease lease, cloud.blazar->Extend(current.id, end));
    PrintLease(lease, out);
  } else if (command == "delete") {
    RETURN_IF_ERROR(cloud.blazar->Delete(flags.lease));
    // The name is the user's, but may be one copied from `lease list`, anyone's.
    out << "deleted lease " << OnOneLine(flags.lease) << "\n";
  }
  return Status::Ok();
}

}  // namespace

// Each Chameleon site has its own Keystone, so a lease at another site than the credentials'
// region must authenticate there. Only Chameleon's OIDC login (v3oidcpassword) works at every
// site; application credentials and Keystone passwords belong to one site, so for those the user
// is told which credentials to use instead of being sent to a Keystone that will refuse them.
Status MoveCredentialsToSite(Credentials& creds, const std::string& site_name,
                             const std::string& why) {
  if (site_name.empty()) return Status::Ok();
  ASSIGN_OR_RETURN(Site site, FindSite(site_name));
  if (site.name == creds.region_name) return Status::Ok();
  std::string_view credentials_site = SiteForAuthUrl(creds.auth_url);
  if (credentials_site.empty()) {
    // Not a Chameleon cloud: its regions are its own business unless the user named one.
    if (creds.region_name.empty()) return Status::Ok();
    return FailedPreconditionError(why + " is at " + std::string(site.name) +
                                   ", but the credentials (" + creds.source + ") are for region " +
                                   creds.region_name + " at " + creds.auth_url +
                                   ", which is not a Chameleon site");
  }
  if (creds.auth_type != AuthType::kV3OidcPassword) {
    return FailedPreconditionError(
        why + " is at " + std::string(site.name) + ", but the credentials (" + creds.source +
        ") are for " + std::string(credentials_site) +
        "; application credentials and passwords belong to one site: use " +
        std::string(site.name) + "'s (its openrc file or a clouds.yaml entry with --os-cloud)");
  }
  creds.auth_url = std::string(site.auth_url);
  creds.region_name = std::string(site.name);
  creds.client_id = std::string(site.oidc_client_id);
  return Status::Ok();
}

StatusOr<std::chrono::seconds> ParseDuration(std::string_view text) {
  auto bad = [&] {
    return InvalidArgumentError("duration '" + std::string(text) +
                                "' is not like 2h50m (units d, h, m, s)");
  };
  if (text.empty()) return bad();
  int64_t total = 0;
  size_t i = 0;
  while (i < text.size()) {
    size_t digits = i;
    while (digits < text.size() && std::isdigit(static_cast<unsigned char>(text[digits]))) ++digits;
    if (digits == i || digits == text.size() || digits - i > 6) return bad();
    int64_t value = std::stoll(std::string(text.substr(i, digits - i)));
    switch (text[digits]) {
      case 'd':
        total += value * 86400;
        break;
      case 'h':
        total += value * 3600;
        break;
      case 'm':
        total += value * 60;
        break;
      case 's':
        total += value;
        break;
      default:
        return bad();
    }
    // Checked after each term (at most 999999d, far inside int64), so that no number of terms
    // ("999999d999999d...") can overflow the sum.
    if (total > kMaxLeaseDuration.count()) {
      return InvalidArgumentError("duration '" + std::string(text) + "' is longer than " +
                                  std::to_string(kMaxLeaseDuration.count() / 86400) +
                                  "d, the longest lease llmctl asks Blazar for");
    }
    i = digits + 1;
  }
  if (total <= 0) return InvalidArgumentError("duration '" + std::string(text) + "' is zero");
  return std::chrono::seconds(total);
}

int RunLeaseCommand(const std::vector<std::string>& args, std::ostream& out, std::ostream& err,
                    const LeaseCommandContext& context) {
  CLI::App app{"Blazar leases on an OpenStack (Chameleon) site", "llmctl lease"};
  app.require_subcommand(1);
  LeaseFlags flags;
  app.add_option("--os-cloud", flags.os_cloud, "cloud in clouds.yaml (default: OS_* variables)");

  CLI::App* create = app.add_subcommand("create", "reserve a KVM flavor or bare-metal nodes");
  create->add_option("--flavor", flags.flavor, "Nova flavor, e.g. g1.h100.pci.1 (KVM sites)");
  create->add_option("--node-type", flags.node_type, "node type, e.g. gpu_a100_pcie (bare metal)");
  create->add_option("--hosts", flags.hosts, "nodes to reserve with --node-type")->default_val(1);
  create->add_option("--site", flags.site,
                     "CHI@UC, CHI@TACC, KVM@TACC, ... (default: from the "
                     "flavor, else OS_REGION_NAME)");
  create->add_option("--start", flags.start, "UTC start, 'YYYY-MM-DD HH:MM' (default: now)");
  create->add_option("--duration", flags.duration, "lease length")->default_val(kDefaultDuration);
  create->add_option("--name", flags.name, "lease name (default: llmctl-<flavor>-<start>)");
  create->add_flag("--wait", flags.wait, "wait until the lease is ACTIVE");

  CLI::App* list = app.add_subcommand("list", "leases of the project");
  list->add_option("--site", flags.site, "site (default: the credentials' region)");
  CLI::App* show = app.add_subcommand("show", "one lease");
  show->add_option("lease", flags.lease, "lease name or id")->required();
  show->add_flag("--wait", flags.wait, "wait until the lease is ACTIVE (one reserved ahead)");
  CLI::App* extend = app.add_subcommand("extend", "move a lease's end later");
  extend->add_option("lease", flags.lease, "lease name or id")->required();
  extend->add_option("--duration", flags.duration, "how much longer, e.g. 1h")->required();
  CLI::App* remove = app.add_subcommand("delete", "end and delete a lease");
  remove->add_option("lease", flags.lease, "lease name or id")->required();
  for (CLI::App* sub : {show, extend, remove}) {
    sub->add_option("--site", flags.site, "site (default: the credentials' region)");
  }

  if (std::optional<int> stop = ParseCommandWords(app, args, "lease", out, err)) return *stop;
  std::string command = app.get_subcommands().front()->get_name();
  Status status = command == "create" ? RunCreate(flags, out, err, context)
                                      : RunOther(command, flags, out, err, context);
  return CommandExitCode(status, "lease", command, err);
}

}  // namespace llmctl::openstack
