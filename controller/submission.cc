#include "controller/submission.h"

#include <algorithm>
#include <cmath>
#include <filesystem>

#include "common/digest/digest.h"
#include "common/estimate/memory_verdict.h"
#include "common/estimate/rate_probe.h"
#include "common/estimate/step_time.h"
#include "common/experiment.h"
#include "common/text.h"
#include "common/trial_keys.h"
#include "common/trial_name.h"

namespace llmctl::controller {

StatusOr<store::NewExperiment> PrepareSubmission(
    std::string_view yaml_text, std::string_view filename,
    const std::map<std::string, digest::InputTree>& inputs, const BlobStore& blobs,
    const std::vector<std::string>& only_trials) {
  if (filename.empty()) return InvalidArgumentError("submit: the request names no file");
  // Stored, logged and shown by `llmctl list` and the report, and the start of every message
  // about the file: a newline would forge a log line, an escape a terminal's sequence. Not
  // quoted: the problem is in it.
  if (const std::string problem = PrintableTextProblem(filename, kMaxFilenameBytes);
      !problem.empty()) {
    return InvalidArgumentError("submit: the file's name (filename) " + problem);
  }
  ASSIGN_OR_RETURN(Experiment parsed,
                   ParseExperiment(yaml_text, filename,
                                   {.resolve_local_paths = false, .output_dir_in_run = true}));
  if (!only_trials.empty()) RETURN_IF_ERROR(KeepOnlyTrials(only_trials, filename, parsed));

  store::NewExperiment experiment;
  experiment.name = parsed.name;
  experiment.filename = std::string(filename);
  experiment.yaml_text = std::string(yaml_text);
  experiment.description = parsed.description;
  experiment.target = parsed.target;
  for (const auto& [path, tree] : inputs) {
    const std::string where = std::string(filename) + ": input '" + path + "'";
    RETURN_IF_ERROR(digest::ValidateInputTree(where, tree));
    std::vector<std::string> wanted;
    for (const digest::TreeFile& file : tree.files) wanted.push_back(file.sha256);
    ASSIGN_OR_RETURN(std::vector<std::string> missing, blobs.Missing(wanted));
    if (!missing.empty()) {
      return FailedPreconditionError(where + ": " + std::to_string(missing.size()) + " of " +
                                     std::to_string(wanted.size()) +
                                     " files are not uploaded yet (first: " + missing.front() +
                                     "); upload them with UploadBlob, then submit again");
    }
    // The size each file claims is what a node is told to expect: one that is not its blob's
    // would have every launch's upload refused, and the trial wait for ever.
    for (const digest::TreeFile& file : tree.files) {
      std::error_code error;
      const uintmax_t size = std::filesystem::file_size(blobs.PathOf(file.sha256), error);
      if (error || size != static_cast<uintmax_t>(file.size)) {
        return InvalidArgumentError(where + ": file '" + file.path + "' claims " +
                                    std::to_string(file.size) + " bytes, its uploaded blob has " +
                                    (error ? error.message() : std::to_string(size)));
      }
    }
    experiment.inputs[path] = tree.digest;
  }
  for (const Trial& trial : parsed.trials) {
    store::NewTrial& stored = experiment.trials.emplace_back();
    stored.name = trial.name;
    stored.description = trial.description;
    stored.config_json = trial.config.ToJson().dump();
    stored.expect = trial.expect;
    stored.device_type = Name(trial.config.settings().device.kind);
    // A cpu trial's ranks (strategy ddp or fsdp, devices N) are N processes sharing the host's one
    // `cpu` device, which is what a CPU node lists: it needs that device, not N of them. The agent
    // starts the ranks from the trial's config.
    stored.device_count = stored.device_type == "cpu" ? 1 : trial.config.settings().device.count;
  }
  return experiment;
}

Status AttachPredictions(const std::map<std::string, nlohmann::json>& predictions,
                         store::NewExperiment& experiment) {
  // Not structured bindings: the lambda below captures the name, which Debian's clang 14 (the
  // thread-safety check) cannot do with bindings.
  for (const auto& entry : predictions) {
    const std::string& name = entry.first;
    const nlohmann::json& prediction = entry.second;
    auto trial = std::find_if(experiment.trials.begin(), experiment.trials.end(),
                              [&](const store::NewTrial& t) { return t.name == name; });
    // The name is the caller's, of any bytes, until it matches one of the file's trials.
    const std::string where =
        experiment.filename + ": prediction of trial '" + OnOneLine(name, kMaxTrialNameBytes) + "'";
    if (trial == experiment.trials.end()) {
      return InvalidArgumentError(where + ": the file has no such trial");
    }
    for (const char* key :
         {"peak_bytes", "activation_bytes", "model_state_bytes", "device_memory_bytes"}) {
      if (!prediction.contains(key) || !prediction[key].is_number_integer() ||
          prediction[key].get<int64_t>() < 0) {
        return InvalidArgumentError(where + ": " + key + " must be a byte count");
      }
    }
    for (const char* key : {"peak_phase", "time_device", "calibration"}) {
      if (!prediction.contains(key)) continue;
      if (!prediction[key].is_string())
        return InvalidArgumentError(where + ": " + key + " must be text");
      const std::string problem =
          PrintableTextProblem(prediction[key].get<std::string>(), kMaxPredictionTextBytes);
      if (!problem.empty()) return InvalidArgumentError(where + ": " + key + " " + problem);
    }
    if (prediction.contains("verdict")) {
      const nlohmann::json& verdict = prediction["verdict"];
      // "" without a device to judge against.
      if (!verdict.is_string() ||
          (verdict != "" && !estimate::ParseVerdict(verdict.get<std::string>()))) {
        return InvalidArgumentError(where + ": verdict must be fits, tight or oom, not " +
                                    OnOneLine(verdict.dump(), 40));
      }
    }
    if (prediction.contains("step_seconds")) {
      for (const char* key : {"step_seconds", "tokens_per_second", "trial_seconds"}) {
        // JSON has no infinity or NaN: stored, either would read back as null.
        if (!prediction[key].is_number() || !std::isfinite(prediction[key].get<double>()) ||
            !(prediction[key].get<double>() >= 0)) {
          return InvalidArgumentError(where + ": " + key + " must be a finite non-negative number");
        }
      }
      if (prediction.contains("pace_seconds") &&
          (!prediction["pace_seconds"].is_number() ||
           !estimate::IsPaceSeconds(prediction["pace_seconds"].get<double>()))) {
        return InvalidArgumentError(where + ": pace_seconds must be a pace canary's seconds");
      }
      StatusOr<estimate::StepWork> work = estimate::StepWork::FromJson(prediction["work"]);
      if (!work.ok()) return InvalidArgumentError(where + ": " + work.status().message());
      // Kept as it reads back, not as the client wrote it: members the work has no use for
      // (megabytes of them, sent 2,000 runs at a time by TimedRuns) are not stored.
      nlohmann::json stored = prediction;
      stored["work"] = work->ToJson();
      trial->prediction_json = stored.dump();
    } else {
      trial->prediction_json = prediction.dump();
    }
    // TimedRuns sends up to store::kMaxTimedRuns of them in one answer.
    if (trial->prediction_json->size() > kMaxPredictionBytes) {
      return InvalidArgumentError(where + ": " + std::to_string(trial->prediction_json->size()) +
                                  " bytes stored, over the " + std::to_string(kMaxPredictionBytes) +
                                  "-byte limit");
    }
  }
  return Status::Ok();
}

std::map<std::string, std::string> TrialInputDigests(
    const TrialConfig& config, const std::map<std::string, std::string>& experiment_inputs) {
  std::map<std::string, std::string> digests;
  for (const KeySpec& spec : TrialKeys()) {
    // `model` is a string (a preset name or a directory), so it is named besides the kPath keys.
    if (spec.type != KeyType::kPath && spec.name != "model") continue;
    const std::string value = config.GetString(spec.name);
    if (value.empty()) continue;
    if (auto it = experiment_inputs.find(value); it != experiment_inputs.end()) {
      digests[std::string(spec.name)] = it->second;
    }
  }
  return digests;
}

}  // namespace llmctl::controller
