// The OpenStack simulator (openstack_sim.py) as a test sees it: started on port 0, driven through
// its admin endpoints, with a CloudClock that moves the simulator's time when the client sleeps.
#ifndef LLMCTL_TESTS_OPENSTACK_SIM_SIMULATOR_H_
#define LLMCTL_TESTS_OPENSTACK_SIM_SIMULATOR_H_

#include <chrono>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/http/http_client.h"
#include "common/status.h"
#include "controller/openstack/cloud_clock.h"
#include "controller/openstack/credentials.h"
#include "tests/support/server_process.h"

namespace llmctl::testing {

// The simulator's time: starts where the simulator's does and moves both when either is moved.
class SimulatorClock : public openstack::CloudClock {
 public:
  SimulatorClock(std::string admin_url, openstack::TimePoint start);
  openstack::TimePoint Now() const override { return now_; }
  std::chrono::milliseconds SinceBoot() const override { return since_boot_; }
  void SleepFor(std::chrono::milliseconds duration) override;
  int sleeps() const { return sleeps_; }

 private:
  std::string admin_url_;
  openstack::TimePoint now_;
  std::chrono::milliseconds since_boot_{0};
  int sleeps_ = 0;
  http::HttpClient http_;
};

class Simulator {
 public:
  static constexpr char kStart[] = "2030-01-01T00:00:00";

  // `args` go to openstack_sim.py (e.g. {"--token-ttl", "600"}).
  static StatusOr<std::unique_ptr<Simulator>> Start(const std::vector<std::string>& args = {});

  std::string url() const { return process_->url(); }
  std::string auth_url() const { return url() + "/v3"; }
  SimulatorClock& clock() { return clock_; }

  // POST /admin/<what> with `body`.
  Status Admin(const std::string& what, const nlohmann::json& body = nlohmann::json::object());
  StatusOr<nlohmann::json> Books();
  // Requests the simulator saw with this method whose path starts with `path_prefix`.
  int CountRequests(const std::string& method, const std::string& path_prefix);

  // OS_* variables for the simulator's unrestricted application credential at KVM@TACC, plus
  // `overrides` (an empty value unsets a variable).
  openstack::EnvLookup Environment(const std::map<std::string, std::string>& overrides = {}) const;

 private:
  Simulator(std::unique_ptr<ServerProcess> process, openstack::TimePoint start);
  std::unique_ptr<ServerProcess> process_;
  SimulatorClock clock_;
  http::HttpClient http_;
};

}  // namespace llmctl::testing

#endif  // LLMCTL_TESTS_OPENSTACK_SIM_SIMULATOR_H_
