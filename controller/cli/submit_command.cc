// llmctl submit: the experiment file checked here, its inputs uploaded, each trial's prediction
// stored with it, and (with --provision) a node on the target's lease made first.
#include <cstdint>
#include <limits>
#include <memory>
#include <optional>

#include "common/byte_size.h"
#include "common/estimate/memory_verdict.h"
#include "common/files.h"
#include "common/text.h"
#include "controller/cli/client.h"
#include "controller/cli/llmctl.h"
#include "rpc/grpc_status.h"
#include "rpc/transfer.h"

namespace llmctl::cli {
namespace {

// LLMCTL_MIN_TRANSFER_RATE ("2MiB", per second): the slowest link an upload must survive
// (rpc::TransferDeadline); rpc::kDefaultMinTransferBytesPerSecond when unset.
StatusOr<int64_t> MinTransferRate(const EnvLookup& env) {
  const std::optional<std::string> text = env("LLMCTL_MIN_TRANSFER_RATE");
  if (!text || text->empty()) return rpc::kDefaultMinTransferBytesPerSecond;
  StatusOr<uint64_t> rate = ParseByteSize(*text);
  if (!rate.ok() || *rate == 0 ||
      *rate > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
    return InvalidArgumentError(
        "LLMCTL_MIN_TRANSFER_RATE: expected a rate per second above 0 such as 10MiB, got '" +
        *text + "'");
  }
  return static_cast<int64_t>(*rate);
}

// Read and parsed twice (see SubmitFile), each keeping only `only_trials` when there are any.
StatusOr<SubmitFile> ReadSubmitFile(const std::string& file,
                                    const std::vector<std::string>& only_trials) {
  StatusOr<std::string> text = ReadFileToString(file, kMaxExperimentFileBytes);
  if (!text.ok()) return InvalidArgumentError(text.status().message());  // names the file
  // Locally first, with the files on this machine, exactly as llm-train would: nothing is sent
  // when the file is wrong.
  ASSIGN_OR_RETURN(
      Experiment checked,
      ParseExperiment(*text, file, {.resolve_local_paths = true, .output_dir_in_run = true}));
  ASSIGN_OR_RETURN(
      Experiment as_written,
      ParseExperiment(*text, file, {.resolve_local_paths = false, .output_dir_in_run = true}));
  if (!only_trials.empty()) {
    RETURN_IF_ERROR(KeepOnlyTrials(only_trials, file, checked));
    RETURN_IF_ERROR(KeepOnlyTrials(only_trials, file, as_written));
  }
  return SubmitFile{file, std::move(*text), std::move(checked), std::move(as_written)};
}

v1::TrialPrediction PredictionProto(const TrialPrediction& p) {
  v1::TrialPrediction proto;
  proto.set_peak_bytes(static_cast<int64_t>(p.peak_bytes));
  proto.set_activation_bytes(static_cast<int64_t>(p.activation_bytes));
  proto.set_model_state_bytes(static_cast<int64_t>(p.model_state_bytes));
  proto.set_peak_phase(p.peak_phase);
  proto.set_device_memory_bytes(static_cast<int64_t>(p.device_memory_bytes));
  proto.set_verdict(p.verdict ? std::string(estimate::VerdictName(*p.verdict)) : "");
  proto.set_step_seconds(p.step_seconds);
  proto.set_tokens_per_second(p.tokens_per_second);
  proto.set_trial_seconds(p.trial_seconds);
  proto.set_time_device(p.time_device);
  proto.set_calibration(p.calibration);
  proto.set_work_json(p.work_json);
  proto.set_pace_seconds(p.pace_seconds);
  return proto;
}

v1::SubmitRequest SubmitRequestFor(const SubmitFile& submitted,
                                   const std::vector<std::string>& only_trials,
                                   const SubmitInputs& inputs,
                                   const std::vector<TrialPrediction>& predictions) {
  v1::SubmitRequest request;
  // The file's name is shown by status and report; a proto3 string must be UTF-8, and a name the
  // file system holds in another encoding (Latin-1's "caf\xe9.yaml") fails the whole request.
  request.set_filename(ReplaceInvalidUtf8(submitted.name));
  request.set_yaml_text(submitted.text);
  for (const std::string& name : only_trials) request.add_only_trials(name);
  for (const auto& [written, tree] : inputs.trees) (*request.mutable_inputs())[written] = tree;
  for (const TrialPrediction& p : predictions) {
    (*request.mutable_predictions())[p.trial] = PredictionProto(p);
  }
  return request;
}

}  // namespace

int Llmctl::Submit(const std::string& file, const std::vector<std::string>& only_trials, bool wait,
                   bool provision, const std::vector<std::string>& node_flags) {
  StatusOr<SubmitFile> submitted = ReadSubmitFile(file, only_trials);
  if (!submitted.ok()) return Fail(submitted.status());
  StatusOr<SubmitInputs> inputs = PrepareInputs(*submitted);
  if (!inputs.ok()) return Fail(inputs.status());
  StatusOr<int64_t> min_transfer_rate = MinTransferRate(context_.env);
  if (!min_transfer_rate.ok()) return Fail(min_transfer_rate.status());
  // A configured controller that does not answer ends the submit here, in one message: the
  // predictions' reads of it each noted going without it, before the upload failed the same way.
  if (ConfiguredController().has_value()) {
    const Status reached =
        ReadFromController([](v1::Controller::Stub& stub, grpc::ClientContext& context) {
          v1::ListNodesResponse nodes;
          return stub.ListNodes(&context, v1::ListNodesRequest(), &nodes);
        });
    if (controller_unreachable_.has_value()) return Fail(reached);
  }
  StatusOr<std::vector<TrialPrediction>> predictions = Predict(*submitted);
  if (!predictions.ok()) return Fail(predictions.status());
  // Built before anything is sent: one that the controller could not receive is refused here, not
  // after the uploads and a provisioned node.
  const v1::SubmitRequest request =
      SubmitRequestFor(*submitted, only_trials, *inputs, *predictions);
  if (const Status fits = CheckSubmitRequestFits(request, file); !fits.ok()) return Fail(fits);
  StatusOr<std::unique_ptr<v1::Controller::Stub>> stub = Connect();
  if (!stub.ok()) return Fail(stub.status());
  const Experiment& checked = submitted->checked;
  if (!checked.target.empty()) {
    const Status placed =
        EnsureTargetNode(**stub, checked, provision, node_flags, SizeLease(checked, *predictions));
    if (!placed.ok()) return Fail(placed.WithContext(file + ": target"));
  } else if (provision) {
    return Fail(InvalidArgumentError(
        file + ": --provision needs a `target: {site, flavor}` or `{site, node_type}` in it"));
  }
  StatusOr<UploadSummary> uploaded = UploadMissingBlobs(**stub, inputs->blobs, *min_transfer_rate);
  if (!uploaded.ok()) return Fail(uploaded.status());

  WarnPredictedOom(*submitted, *predictions);
  v1::SubmitResponse response;
  const Status sent =
      rpc::FromGrpcStatus((*stub)->Submit(UnaryContext().get(), request, &response));
  if (!sent.ok()) return Fail(sent);
  context_.out << response.experiment_id() << "\n" << std::flush;
  context_.err << "submitted " << OnOneLine(response.name()) << " ("
               << CountOf(response.trials_size(), "trial", "trials") << "); inputs: "
               << CountOf(static_cast<int64_t>(inputs->trees.size()), "tree", "trees") << ", "
               << CountOf(uploaded->blobs, "file", "files") << ", " << uploaded->uploaded
               << " uploaded (" << CountOf(uploaded->bytes, "byte", "bytes") << ")\n";
  if (!wait) return kExitOk;
  return FollowAndReport(**stub, response.experiment_id());
}

StatusOr<SubmitInputs> Llmctl::PrepareInputs(const SubmitFile& submitted) {
  // Whatever went wrong with a local input (missing, unreadable, malformed) is the caller's to fix:
  // exit 2, like llm-train.
  StatusOr<SubmitInputs> inputs = CollectInputs(submitted.as_written, submitted.name);
  if (!inputs.ok()) return InvalidArgumentError(inputs.status().message());
  for (const std::string& notice : inputs->notices) context_.err << "note: " << notice << "\n";
  // What each input holds, before anything is stored or sent: a broken dataset or tokenizer fails
  // here in seconds, not on a leased node.
  if (const Status contents = CheckLocalInputs(submitted.checked, submitted.name); !contents.ok()) {
    return InvalidArgumentError(contents.message());
  }
  return inputs;
}

StatusOr<std::vector<TrialPrediction>> Llmctl::Predict(const SubmitFile& submitted) {
  // Each trial's predicted memory and time, stored with it so the report can set them beside the
  // measured ones, and what sizes a provisioned lease.
  const StoredCalibrations calibrations = LoadCalibrations();
  const LocalRates rates = LoadRates();
  EstimateOptions estimate_options;
  estimate_options.calibrate = calibrations.Lookup();
  estimate_options.rates = rates.Lookup();
  return PredictTrials(submitted.checked, submitted.name, estimate_options);
}

void Llmctl::WarnPredictedOom(const SubmitFile& submitted,
                              const std::vector<TrialPrediction>& predictions) {
  // A trial predicted to run out of memory that is not meant to is worth a second look, but the
  // prediction may be wrong, so it is a warning, not a refusal.
  const std::string& file = submitted.name;
  for (const TrialPrediction& p : predictions) {
    const Trial* trial = nullptr;
    for (const Trial& t : submitted.checked.trials) {
      if (t.name == p.trial) trial = &t;
    }
    if (trial == nullptr || trial->expect == "oom") continue;
    std::string why;
    std::string shows;
    if (p.verdict == estimate::MemoryVerdict::kOom) {
      // The device's name in the source may be a node's (the controller's words).
      why = " is predicted to run out of memory: its peak " + FormatBytes(p.peak_bytes) +
            " exceeds " + FormatBytes(p.device_memory_bytes) + " (" + OnOneLine(p.device_source) +
            ")";
      shows = "why and what fits (add `expect: oom` if that is the point)";
    } else if (p.verdict == estimate::MemoryVerdict::kTight) {
      why = " may run out of memory: its peak " + FormatBytes(p.peak_bytes) +
            " is within the caching allocator's slack of what it may allocate on " +
            OnOneLine(p.device_source);
      shows = "the limit and what fits";
    } else {
      continue;
    }
    context_.err << "warning: " << file << ": trial " << OnOneLine(p.trial) << why
                 << "; `llmctl estimate " << file << " --trial " << OnOneLine(p.trial)
                 << " --fit --explain` shows " << shows << "\n";
  }
}

}  // namespace llmctl::cli
