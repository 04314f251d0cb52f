#include "tests/openstack_sim/simulator.h"

namespace llmctl::testing {
namespace {

using nlohmann::json;

Status Post(const http::HttpClient& http, const std::string& url, const json& body) {
  http::Request request;
  request.method = "POST";
  request.url = url;
  request.body = body.dump();
  request.headers.Add("Content-Type", "application/json");
  ASSIGN_OR_RETURN(http::Response response, http.Send(request));
  if (response.status != 200) return http::ResponseError(request, response, response.body);
  return Status::Ok();
}

}  // namespace

SimulatorClock::SimulatorClock(std::string admin_url, openstack::TimePoint start)
    : admin_url_(std::move(admin_url)), now_(start) {}

void SimulatorClock::SleepFor(std::chrono::milliseconds duration) {
  ++sleeps_;
  now_ += duration;
  since_boot_ += duration;
  // A test cannot go on with the two clocks apart; a failure here fails it loudly.
  Status status = Post(http_, admin_url_ + "/advance", {{"seconds", duration.count() / 1000.0}});
  if (!status.ok()) throw std::runtime_error("advancing the simulator: " + status.ToString());
}

StatusOr<std::unique_ptr<Simulator>> Simulator::Start(const std::vector<std::string>& args) {
  std::vector<std::string> all = {"--now", kStart};
  all.insert(all.end(), args.begin(), args.end());
  ASSIGN_OR_RETURN(std::unique_ptr<ServerProcess> process,
                   ServerProcess::StartPython("tests/openstack_sim/openstack_sim.py", all));
  ASSIGN_OR_RETURN(openstack::TimePoint start, openstack::ParseUtcTimestamp(kStart));
  return std::unique_ptr<Simulator>(new Simulator(std::move(process), start));
}

Simulator::Simulator(std::unique_ptr<ServerProcess> process, openstack::TimePoint start)
    : process_(std::move(process)), clock_(process_->url() + "/admin", start) {}

Status Simulator::Admin(const std::string& what, const json& body) {
  return Post(http_, url() + "/admin/" + what, body);
}

StatusOr<json> Simulator::Books() {
  http::Request request;
  request.url = url() + "/admin/books";
  ASSIGN_OR_RETURN(http::Response response, http_.Send(request));
  return json::parse(response.body);
}

int Simulator::CountRequests(const std::string& method, const std::string& path_prefix) {
  StatusOr<json> books = Books();
  if (!books.ok()) return -1;
  int count = 0;
  for (const json& request : (*books)["requests"]) {
    if (request["method"] == method &&
        request["path"].get<std::string>().starts_with(path_prefix)) {
      ++count;
    }
  }
  return count;
}

openstack::EnvLookup Simulator::Environment(
    const std::map<std::string, std::string>& overrides) const {
  std::map<std::string, std::string> variables = {
      {"OS_AUTH_URL", auth_url()},
      {"OS_AUTH_TYPE", "v3applicationcredential"},
      {"OS_APPLICATION_CREDENTIAL_ID", "ac-unrestricted"},
      {"OS_APPLICATION_CREDENTIAL_SECRET", "ac-secret"},
      {"OS_REGION_NAME", "KVM@TACC"},
      {"OS_INTERFACE", "public"},
      {"OS_IDENTITY_API_VERSION", "3"},
  };
  for (const auto& [name, value] : overrides) variables[name] = value;
  return [variables](const std::string& name) -> std::optional<std::string> {
    auto found = variables.find(name);
    if (found == variables.end() || found->second.empty()) return std::nullopt;
    return found->second;
  };
}

}  // namespace llmctl::testing
