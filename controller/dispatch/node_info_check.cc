#include "controller/dispatch/node_info_check.h"

#include <set>
#include <string>
#include <utility>

#include "common/estimate/rate_probe.h"
#include "common/text.h"
#include "common/version.h"

namespace llmctl::controller::dispatch {
namespace {

Status Refuse(const std::string& field, const std::string& problem) {
  return InvalidArgumentError("its " + field + " " + problem);
}

Status CheckText(const std::string& field, const std::string& text, size_t max_bytes) {
  const std::string problem = PrintableTextProblem(text, max_bytes);
  return problem.empty() ? Status::Ok() : Refuse(field, problem);
}

}  // namespace

Status CheckNodeInfo(const v1::NodeInfo& info) {
  if (info.devices_size() > kMaxNodeDevices) {
    return Refuse("devices", "number " + std::to_string(info.devices_size()) + ", more than " +
                                 std::to_string(kMaxNodeDevices));
  }
  std::set<std::pair<std::string, int>> seen;
  for (int i = 0; i < info.devices_size(); ++i) {
    const v1::Device& device = info.devices(i);
    const std::string field = "devices[" + std::to_string(i) + "]";
    if (device.type() != "cpu" && device.type() != "cuda") {
      return Refuse(field + ".type", "is not cpu or cuda");
    }
    if (device.index() < 0) return Refuse(field + ".index", "is negative");
    if (!seen.emplace(device.type(), device.index()).second) {
      return Refuse(field + ".index", "repeats another " + device.type() + " device's");
    }
    if (device.memory_bytes() < 0) return Refuse(field + ".memory_bytes", "is negative");
    RETURN_IF_ERROR(CheckText(field + ".name", device.name(), 256));
  }
  if (info.host_memory_bytes() < 0) return Refuse("host_memory_bytes", "is negative");
  if (info.cpu_count() < 0) return Refuse("cpu_count", "is negative");
  for (const auto& [field, text, max_bytes] :
       {std::tuple<const char*, const std::string&, size_t>{"nvidia_driver_version",
                                                            info.nvidia_driver_version(), 64},
        {"driver_cuda_version", info.driver_cuda_version(), 64},
        {"libtorch_version", info.libtorch_version(), 64},
        {"libtorch_cuda_version", info.libtorch_cuda_version(), 64},
        {"llmctl_version", info.llmctl_version(), 256},
        {"trainer_version", info.trainer_version(), 256},
        {"rate_probe_pending", info.rate_probe_pending(), estimate::kRateProbePendingMaxBytes},
        {"unusable", info.unusable(), 1024}}) {
    RETURN_IF_ERROR(CheckText(field, text, max_bytes));
  }
  return Status::Ok();
}

Status CheckMeasureRatesAnswer(const v1::MeasureRatesResponse& answer) {
  return CheckText("pending", answer.pending(), estimate::kRateProbePendingMaxBytes);
}

Status CheckAgentVersion(const std::string& node, const std::string& agent_version) {
  if (agent_version == kVersion) return Status::Ok();
  const std::string version(kVersion);
  const std::string agent = agent_version.empty() ? "an llmctl that does not say its version"
                                                  : std::string("llmctl ").append(agent_version);
  return FailedPreconditionError(
      std::string("node ")
          .append(node)
          .append(": its agent is ")
          .append(agent)
          .append(", this controller llmctl ")
          .append(version)
          .append("; they must be the same version, so no trial is placed there: run llmctl ")
          .append(version)
          .append("'s agent there (a leased node: llmctl node down ")
          .append(node)
          .append(", then llmctl node up --lease LEASE with ")
          .append(version)
          .append("'s --agent-image or --agent-commit; the embedded one: llmctl daemon stop)"));
}

}  // namespace llmctl::controller::dispatch
