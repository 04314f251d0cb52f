#include "controller/cli/estimate.h"

#include <nlohmann/json.hpp>
#include <optional>
#include <vector>

#include "common/estimate/model_state.h"
#include "common/experiment.h"
#include "common/files.h"
#include "common/model_config.h"
#include "common/text.h"
#include "controller/cli/report_format.h"

namespace llmctl::cli {
namespace {

using nlohmann::ordered_json;

constexpr char kActivationsNote[] =
    "activations (and the loss' logits, temporaries, fsdp's gathered parameters) are not "
    "predicted yet: the model state is a lower bound of each rank's peak, not a fits / "
    "out-of-memory verdict";

struct TrialEstimate {
  const Trial* trial;
  // Unset when the trial cannot be estimated here; `reason` says why.
  std::optional<estimate::ModelStateEstimate> bytes;
  std::string reason;
};

StatusOr<TrialEstimate> EstimateTrial(const Trial& trial, const std::string& file) {
  const std::string model_name = trial.config.GetString("model");
  if (IsHubModelRef(model_name)) {
    return TrialEstimate{&trial, std::nullopt,
                         "its model " + model_name +
                             " is on the Hugging Face hub, and only an llmctl agent downloads its "
                             "config.json: it cannot be estimated offline (point model at a local "
                             "directory holding the config.json to estimate it)"};
  }
  const std::string context = file + ": trial " + trial.name;
  // Parsing resolved the model's path beside the file; a directory without a readable config.json
  // is the caller's to fix, as for `llmctl submit`.
  StatusOr<ModelConfig> model = ResolveModel(model_name);
  if (!model.ok()) return InvalidArgumentError(context + ": model: " + model.status().message());
  StatusOr<estimate::ModelStateEstimate> bytes = estimate::EstimateModelState(trial.config, *model);
  if (!bytes.ok()) return InvalidArgumentError(context + ": " + bytes.status().message());
  return TrialEstimate{&trial, *bytes, ""};
}

std::string RenderTable(const std::string& file, const Experiment& experiment,
                        const std::vector<TrialEstimate>& estimates) {
  bool comm = false;
  bool host = false;
  for (const TrialEstimate& e : estimates) {
    comm |= e.bytes && e.bytes->world_size > 1;
    host |= e.bytes && e.bytes->optim_host_bytes > 0;
  }
  std::vector<std::vector<std::string>> rows;
  std::vector<std::string> header = {"trial", "model", "ranks", "params", "grads", "optim"};
  if (host) header.push_back("optim host");
  if (comm) header.push_back("comm");
  header.push_back("model state");
  rows.push_back(header);
  std::string notes;
  for (const TrialEstimate& e : estimates) {
    std::vector<std::string> row = {e.trial->name, e.trial->config.GetString("model")};
    if (!e.bytes) {
      row.resize(header.size(), std::string(kNone));
      rows.push_back(row);
      notes += e.trial->name + ": not estimated: " + e.reason + "\n";
      continue;
    }
    const estimate::ModelStateEstimate& b = *e.bytes;
    auto mib = [](uint64_t bytes) { return Mib(static_cast<int64_t>(bytes)); };
    row.insert(row.end(), {std::to_string(b.world_size), mib(b.params_bytes), mib(b.grads_bytes),
                           mib(b.optim_device_bytes)});
    if (host) row.push_back(mib(b.optim_host_bytes));
    if (comm) row.push_back(b.world_size > 1 ? mib(b.comm_bytes) : std::string(kNone));
    row.push_back(mib(b.device_bytes()));
    rows.push_back(row);
  }
  return "estimate of " + file + " (" + experiment.name +
         "): model state per rank on the training device, MiB" +
         (host ? " (optim host: in host memory, not in the model state)" : "") + "\n" +
         FormatColumns(rows, /*first_right_aligned=*/2) + notes +
         "Not included: " + kActivationsNote + ".\n";
}

std::string RenderJson(const std::string& file, const Experiment& experiment,
                       const std::vector<TrialEstimate>& estimates) {
  ordered_json out = {{"file", file},
                      {"experiment", experiment.name},
                      {"activations_predicted", false},
                      {"note", kActivationsNote},
                      {"trials", ordered_json::array()}};
  for (const TrialEstimate& e : estimates) {
    ordered_json trial = {{"name", e.trial->name},
                          {"model", e.trial->config.GetString("model")},
                          {"estimated", e.bytes.has_value()}};
    if (!e.bytes) {
      trial["reason"] = e.reason;
    } else {
      const estimate::ModelStateEstimate& b = *e.bytes;
      trial.update(ordered_json{{"world_size", b.world_size},
                                {"parameters_total", b.parameters_total},
                                {"parameters_trainable", b.parameters_trainable},
                                {"params_bytes", b.params_bytes},
                                {"grads_bytes", b.grads_bytes},
                                {"optim_device_bytes", b.optim_device_bytes},
                                {"optim_host_bytes", b.optim_host_bytes},
                                {"comm_bytes", b.comm_bytes},
                                {"model_state_bytes", b.device_bytes()}});
    }
    out["trials"].push_back(trial);
  }
  return out.dump(2) + "\n";
}

}  // namespace

StatusOr<std::string> EstimateExperiment(const std::string& file, const std::string& trial,
                                         const std::string& format) {
  if (format != "table" && format != "json") {
    return InvalidArgumentError("--format: expected table or json, got '" + format + "'");
  }
  StatusOr<std::string> text = ReadFileToString(file, kMaxExperimentFileBytes);
  if (!text.ok()) return InvalidArgumentError(text.status().message());  // names the file
  // As `llmctl submit` checks it on this machine: the same messages, FILE:LINE:COLUMN.
  ASSIGN_OR_RETURN(Experiment experiment,
                   ParseExperiment(*text, file, {.resolve_local_paths = true}));
  std::vector<TrialEstimate> estimates;
  std::string names;
  for (const Trial& t : experiment.trials) {
    names += (names.empty() ? "" : ", ") + t.name;
    if (!trial.empty() && t.name != trial) continue;
    ASSIGN_OR_RETURN(TrialEstimate estimate, EstimateTrial(t, file));
    estimates.push_back(std::move(estimate));
  }
  if (estimates.empty()) {
    return InvalidArgumentError(file + ": no trial named '" + trial + "' (trials: " + names + ")");
  }
  return format == "json" ? RenderJson(file, experiment, estimates)
                          : RenderTable(file, experiment, estimates);
}

}  // namespace llmctl::cli
