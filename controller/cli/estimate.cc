#include "controller/cli/estimate.h"

#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <vector>

#include "common/blip2_config.h"
#include "common/byte_size.h"
#include "common/estimate/blip2_memory.h"
#include "common/estimate/blip2_work.h"
#include "common/estimate/gpus.h"
#include "common/estimate/step_memory.h"
#include "common/experiment.h"
#include "common/files.h"
#include "common/model_config.h"
#include "common/text.h"
#include "common/trial_keys.h"
#include "controller/cli/report_format.h"
#include "common/inputs/captions.h"
#include "common/inputs/drawn_batches.h"
#include "common/inputs/trial_inputs.h"

namespace llmctl::cli {
namespace {

using nlohmann::ordered_json;

constexpr char kAssumptions[] =
    "Peak: one rank's highest allocated bytes in a training step at the longest micro-batch the "
    "run draws when its data and tokenizer are on this machine, else at micro_batch_size x "
    "data.max_seq_length tokens (each trial's note says which; the trainer pads a micro-batch to "
    "its longest row), checked "
    "against llm-train's measured peaks on the CPU and on an H200 (docs/estimate.md: 0.2% to "
    "0.6% below CUDA's allocated peak, whose cuBLAS workspaces it leaves out). Outside it: the "
    "CUDA context (700 to 760 MiB on the H200) and what the caching allocator reserves beyond "
    "what it allocates (1% to 13% in the H200 run).";

// Which rates a time is at: a probe's (its description), else the data sheet's.
std::string RatesText(const std::string& rates) {
  return rates.empty() ? "the data sheet's nominal rates" : "measured rates: " + rates;
}

// The memory a trial's verdict is made against, and where that figure came from.
struct Device {
  uint64_t bytes = 0;
  std::string source;
  std::optional<estimate::Gpu> gpu;  // when the figure is a GPU's
};

struct TrialEstimate {
  const Trial* trial = nullptr;
  // Unset when the trial cannot be estimated here; `reason` says why.
  std::optional<estimate::StepMemoryEstimate> memory = {};
  std::string reason = {};
  std::optional<Device> device = {};
  std::optional<estimate::MicroBatchFit> fit = {};  // with --fit and a device
  // The predicted time; unset for a cuda trial without a known GPU (`time_reason` says so).
  std::optional<estimate::TimeEstimate> time = {};
  std::optional<estimate::StepWork> work = {};
  std::string time_device = {};
  std::string calibration = {};
  std::string rates = {};  // the probe whose rates the time is at; "" for the data sheet's
  std::string time_reason = {};
  // What the estimate assumed that the table does not show (BLIP-2's captions).
  std::string note = {};

  // "fits", "oom", or "" without a device.
  std::string Verdict() const {
    if (!memory || !device) return "";
    return memory->peak_bytes <= device->bytes ? "fits" : "oom";
  }
};

StatusOr<std::optional<Device>> ParseDeviceOption(const std::string& text) {
  if (text.empty()) return std::optional<Device>();
  if (std::optional<estimate::Gpu> gpu = estimate::GpuNamed(text)) {
    return std::optional<Device>(
        Device{gpu->memory_bytes, "--device-memory " + gpu->name + " (" + gpu->model + ")", gpu});
  }
  StatusOr<uint64_t> bytes = ParseByteSize(text);
  if (!bytes.ok() || *bytes == 0) {
    std::string gpus;
    for (const estimate::Gpu& gpu : estimate::KnownGpus()) {
      gpus += (gpus.empty() ? "" : ", ") + gpu.name;
    }
    return InvalidArgumentError("--device-memory: expected a size such as 80GiB or a GPU (" + gpus +
                                "), got '" + text + "'");
  }
  return std::optional<Device>(Device{*bytes, "--device-memory " + text, std::nullopt});
}

// The trial's own device: its device_memory (the simulated device on the CPU, a budget on a
// GPU), else on cuda the GPU of the experiment's target.
std::optional<Device> TrialDevice(const Trial& trial, const Experiment& experiment) {
  const DeviceSettings& device = trial.config.settings().device;
  if (device.memory) {
    return Device{device.memory->bytes, "device_memory " + device.memory->text, std::nullopt};
  }
  if (device.kind != trial::Device::kCuda) return std::nullopt;
  std::optional<estimate::Gpu> gpu = estimate::GpuOfTarget(experiment.target);
  if (!gpu) return std::nullopt;
  std::string target;
  for (const auto& [key, value] : experiment.target) {
    if (key == "flavor" || key == "node_type") target = key + " " + value;
  }
  return Device{gpu->memory_bytes, "target " + target + ": " + gpu->model, gpu};
}

// The speed a trial's time is predicted at: the host's CPU for a cpu trial; for a cuda one the GPU
// of --device-memory when it names one, else of the experiment's target.
std::optional<estimate::DeviceSpeed> TrialSpeed(const Trial& trial, const Experiment& experiment,
                                                const std::optional<Device>& device_option) {
  if (trial.config.settings().device.kind != trial::Device::kCuda) return estimate::CpuSpeed();
  if (device_option && device_option->gpu) return estimate::GpuSpeed(*device_option->gpu);
  if (std::optional<estimate::Gpu> gpu = estimate::GpuOfTarget(experiment.target)) {
    return estimate::GpuSpeed(*gpu);
  }
  return std::nullopt;
}

// The sequence lengths a LLaMA-family trial's estimate takes: the longest micro-batch the run draws
// for its peak and the mean one for its time (common/inputs/drawn_batches.h), when the dataset and
// tokenizer are on this machine; data.max_seq_length otherwise.
struct DrawnLengths {
  // At the longest micro-batch of the steps after the first; with accumulation, of those that run
  // beside the gradients of the step's earlier micro-batches.
  TrialConfig peak_config;
  // With accumulation, when a later step's first micro-batch is longer than those: at that one,
  // without accumulation (no gradient is held yet; its optimizer step is the same).
  std::optional<TrialConfig> opening_config;
  // When the first step draws a longer micro-batch than any later one: at that one. The first
  // step's forward and backward run before the optimizer's state exists.
  std::optional<TrialConfig> first_step_config;
  TrialConfig time_config;
  double real_tokens = 0;  // a micro-batch's mean real tokens; 0 when not drawn
  std::string note;
};

StatusOr<DrawnLengths> DrawLengths(const TrialConfig& config, const std::string& context) {
  DrawnLengths lengths{config, std::nullopt, std::nullopt, config, 0, ""};
  const TrialSettings& settings = config.settings();
  const int64_t max_length = settings.data.max_seq_length;
  const std::string& data_path = settings.data.path;
  const StatusOr<std::string> tokenizer = TrialTokenizerPath(config);
  if (IsNodePath(data_path) || IsNodePath(settings.model.tokenizer) || !tokenizer.ok() ||
      !std::filesystem::exists(*tokenizer)) {
    lengths.note = "sequences at data.max_seq_length (" + std::to_string(max_length) +
                   " tokens): the dataset or its tokenizer is not on this machine";
    return lengths;
  }
  StatusOr<DrawnBatches> drawn = DrawMicroBatches(config);
  if (!drawn.ok()) return InvalidArgumentError(context + ": " + drawn.status().message());
  const int64_t accumulating = drawn->longest_later_accumulating;
  const int64_t opening =
      drawn->longest_later_opening > 0 ? drawn->longest_later_opening : drawn->longest;
  const int64_t later = std::max(accumulating, opening);
  std::string later_text = std::to_string(later) + " tokens";
  if (accumulating > 0 && opening > accumulating) {
    // A longer micro-batch opens a step: estimated as a step of its own (no gradient held yet),
    // beside the longest that accumulates.
    lengths.opening_config = config;
    RETURN_IF_ERROR(
        lengths.opening_config->SetFromText("data.max_seq_length", std::to_string(opening)));
    RETURN_IF_ERROR(lengths.opening_config->SetFromText(
        "train.global_batch_size",
        std::to_string(settings.train.micro_batch_size * DataParallelRanks(config))));
    RETURN_IF_ERROR(
        lengths.peak_config.SetFromText("data.max_seq_length", std::to_string(accumulating)));
    later_text = std::to_string(accumulating) + " tokens beside held gradients and " +
                 std::to_string(opening) + " opening a step";
  } else {
    RETURN_IF_ERROR(lengths.peak_config.SetFromText("data.max_seq_length", std::to_string(later)));
  }
  if (drawn->longest_first_step > later) {
    lengths.first_step_config = config;
    RETURN_IF_ERROR(lengths.first_step_config->SetFromText(
        "data.max_seq_length", std::to_string(drawn->longest_first_step)));
  }
  RETURN_IF_ERROR(lengths.time_config.SetFromText(
      "data.max_seq_length", std::to_string(static_cast<int64_t>(std::ceil(drawn->mean_padded)))));
  lengths.real_tokens = drawn->mean_real_tokens;
  lengths.note = "sequences as the run draws them with seed " +
                 std::to_string(settings.train.seed) + " over " + std::to_string(drawn->steps) +
                 " steps: the peak at the longest micro-batch after the first step, " + later_text +
                 (lengths.first_step_config
                      ? " (the first step's " + std::to_string(drawn->longest_first_step) +
                            ", before the optimizer's state exists)"
                      : "") +
                 ", the time at the mean, " + Printf("%.1f", drawn->mean_padded) +
                 " (data.max_seq_length " + std::to_string(max_length) + ")";
  return lengths;
}

// The trial's time on its device (TrialSpeed) from its step's `work`, calibrated by `options`; a
// cuda trial without a GPU this table knows is left without one, saying why. InvalidArgument as
// the work's.
Status AddTime(const Experiment& experiment, const EstimateOptions& options,
               const std::optional<Device>& device_option,
               const std::function<StatusOr<estimate::StepWork>()>& work, TrialEstimate& result) {
  const Trial& trial = *result.trial;
  std::optional<estimate::DeviceSpeed> speed = TrialSpeed(trial, experiment, device_option);
  if (speed && options.rates) speed = options.rates(*speed);
  if (!speed) {
    result.time_reason =
        "no GPU to time it on: the target names none this table knows (pass --device-memory "
        "with a GPU such as h100-94gb)";
    return Status::Ok();
  }
  StatusOr<estimate::StepWork> counted = work();
  if (!counted.ok()) return InvalidArgumentError(counted.status().message());
  const estimate::Calibration calibration =
      options.calibrate ? options.calibrate(*speed, counted->family)
                        : estimate::DefaultCalibration(*speed, counted->family);
  estimate::TimeEstimate time = estimate::EstimateTime(*counted, *speed, calibration,
                                                       trial.config.settings().train.max_steps);
  // A model directory's config.json may state any size: the step's work and time can then pass
  // what a double holds. JSON has no infinity (it would be stored as null), so such a time is left
  // out, saying why, as the controller would refuse it.
  const bool finite = estimate::StepWork::FromJson(counted->ToJson()).ok() &&
                      std::isfinite(time.step_seconds) && time.step_seconds > 0 &&
                      std::isfinite(time.tokens_per_second) && std::isfinite(time.trial_seconds);
  if (!finite) {
    result.time_reason =
        "its step's work is past what the time estimate counts (not a finite number of seconds): "
        "check the model's sizes";
    return Status::Ok();
  }
  result.time = std::move(time);
  result.work = *counted;
  result.time_device = speed->name;
  result.calibration = calibration.source;
  result.rates = speed->rates;
  return Status::Ok();
}

// A BLIP-2 trial (data.format imagefolder): common/estimate/blip2_memory.h's memory, with the
// captions at the longest of a caption set on this machine, read with the trial's tokenizer (the
// trainer pads a micro-batch to its longest row), else at data.max_seq_length. A model on the hub
// is estimated when its name is a preset's, whose shapes are the hub's config.json. Its time is
// counted at the same captions (common/estimate/blip2_work.h).
StatusOr<TrialEstimate> EstimateBlip2Trial(const Trial& trial, const Experiment& experiment,
                                           const std::string& file, const EstimateOptions& options,
                                           const std::optional<Device>& device_option) {
  const std::string& model_name = trial.config.settings().model.name;
  const std::string context = file + ": trial " + trial.name;
  std::string resolved = model_name;
  if (IsHubModelRef(model_name)) {
    StatusOr<HubModelRef> ref = ParseHubModelRef(model_name);
    if (!ref.ok() || !IsBlip2Preset(ref->repo)) {
      return TrialEstimate{
          .trial = &trial,
          .reason = "its model " + model_name +
                    " is on the Hugging Face hub and not one of the BLIP-2 presets whose shapes "
                    "llmctl knows (blip2-opt-2.7b, blip2-opt-6.7b, blip2-flan-t5-xl, "
                    "blip2-flan-t5-xxl): point model at a local directory holding its "
                    "config.json to estimate it"};
    }
    resolved = ref->repo;
  }
  StatusOr<std::optional<Blip2Config>> model = ResolveBlip2Model(resolved);
  if (!model.ok()) return InvalidArgumentError(context + ": model: " + model.status().message());
  if (!model->has_value()) {
    return InvalidArgumentError(context + ": model: " + model_name + " is not a BLIP-2 model");
  }
  std::optional<int64_t> caption_tokens;
  std::string note = "captions at data.max_seq_length (" +
                     std::to_string(trial.config.settings().data.max_seq_length) + " tokens)";
  const std::string& data_path = trial.config.settings().data.path;
  const std::string& tokenizer = trial.config.settings().model.tokenizer;
  // Without `tokenizer` a hub model's own is read, on the node.
  if (!IsNodePath(data_path) && !IsNodePath(tokenizer) &&
      (!tokenizer.empty() || !IsHubModelRef(model_name))) {
    StatusOr<int64_t> longest = LongestCaptionTokens(trial.config, **model);
    if (!longest.ok()) return InvalidArgumentError(context + ": " + longest.status().message());
    caption_tokens = *longest;
    note = "captions at the longest of " + data_path + ", " + std::to_string(*longest) + " tokens";
  } else {
    note += ": the caption set or its tokenizer is not on this machine";
  }
  StatusOr<estimate::StepMemoryEstimate> memory =
      estimate::EstimateBlip2StepMemory(trial.config, **model, caption_tokens);
  if (!memory.ok()) return InvalidArgumentError(context + ": " + memory.status().message());
  TrialEstimate result{.trial = &trial,
                       .memory = *memory,
                       .device = device_option ? device_option : TrialDevice(trial, experiment),
                       .note = note};
  // The step's time, with the captions the memory is estimated at.
  RETURN_IF_ERROR(
      AddTime(
          experiment, options, device_option,
          [&] { return estimate::EstimateBlip2StepWork(trial.config, **model, caption_tokens); },
          result)
          .WithContext(context));
  if (options.fit && result.device) {
    StatusOr<estimate::MicroBatchFit> fit =
        estimate::FitBlip2MicroBatch(trial.config, **model, caption_tokens, result.device->bytes);
    if (!fit.ok()) return InvalidArgumentError(context + ": " + fit.status().message());
    result.fit = *fit;
  }
  return result;
}

StatusOr<TrialEstimate> EstimateTrial(const Trial& trial, const Experiment& experiment,
                                      const std::string& file, const EstimateOptions& options,
                                      const std::optional<Device>& device_option) {
  const std::string& model_name = trial.config.settings().model.name;
  if (trial.config.settings().data.format == trial::DataFormat::kImagefolder) {
    // Parsing checked that the model is BLIP-2, the only family that reads images.
    return EstimateBlip2Trial(trial, experiment, file, options, device_option);
  }
  if (IsHubModelRef(model_name)) {
    return TrialEstimate{
        .trial = &trial,
        .reason = "its model " + model_name +
                  " is on the Hugging Face hub, and only an llmctl agent downloads its "
                  "config.json: it cannot be estimated offline (point model at a local "
                  "directory holding the config.json to estimate it)"};
  }
  const std::string context = file + ": trial " + trial.name;
  // Parsing resolved the model's path beside the file; a directory without a readable config.json
  // is the caller's to fix, as for `llmctl submit`.
  StatusOr<ModelConfig> model = ResolveModel(model_name);
  if (!model.ok()) return InvalidArgumentError(context + ": model: " + model.status().message());
  // The lengths the run will draw, when its data and tokenizer are on this machine: the peak at
  // its longest micro-batch, the time at its mean one.
  ASSIGN_OR_RETURN(const DrawnLengths drawn, DrawLengths(trial.config, context));
  StatusOr<estimate::StepMemoryEstimate> memory =
      estimate::EstimateStepMemory(drawn.peak_config, *model);
  if (!memory.ok()) return InvalidArgumentError(context + ": " + memory.status().message());
  if (drawn.opening_config) {
    StatusOr<estimate::StepMemoryEstimate> opening =
        estimate::EstimateStepMemory(*drawn.opening_config, *model);
    if (!opening.ok()) return InvalidArgumentError(context + ": " + opening.status().message());
    if (opening->peak_bytes > memory->peak_bytes) memory = std::move(opening);
  }
  if (drawn.first_step_config) {
    // The first step's longer micro-batch, less the optimizer's state its forward and backward
    // run without (its optimizer step holds the state, as every later one does).
    StatusOr<estimate::StepMemoryEstimate> first =
        estimate::EstimateStepMemory(*drawn.first_step_config, *model);
    if (!first.ok()) return InvalidArgumentError(context + ": " + first.status().message());
    const uint64_t first_peak = first->peak_phase == "optimizer step"
                                    ? first->peak_bytes
                                    : first->peak_bytes - first->state.optim_device_bytes;
    if (first_peak > memory->peak_bytes) {
      memory = std::move(first);
      memory->peak_bytes = first_peak;
      memory->peak_phase += " (first step)";
    }
  }
  TrialEstimate result{.trial = &trial,
                       .memory = *memory,
                       .device = device_option ? device_option : TrialDevice(trial, experiment),
                       .note = drawn.note};
  RETURN_IF_ERROR(AddTime(
                      experiment, options, device_option,
                      [&]() -> StatusOr<estimate::StepWork> {
                        ASSIGN_OR_RETURN(estimate::StepWork work,
                                         estimate::EstimateStepWork(drawn.time_config, *model));
                        // Tokens/s counts real tokens, as the trainer does.
                        if (drawn.real_tokens > 0) {
                          work.tokens =
                              static_cast<int64_t>(drawn.real_tokens) * work.micro_batches;
                        }
                        return work;
                      },
                      result)
                      .WithContext(context));
  if (options.fit && result.device) {
    StatusOr<estimate::MicroBatchFit> fit =
        estimate::FitMicroBatch(trial.config, *model, result.device->bytes);
    if (!fit.ok()) return InvalidArgumentError(context + ": " + fit.status().message());
    result.fit = *fit;
  }
  return result;
}

std::string MibText(uint64_t bytes) { return Mib(static_cast<int64_t>(bytes)); }

// Minutes with a tenth, or two significant digits under one: 0.052, 0.87, 12.4.
std::string MinutesText(double seconds) {
  const double minutes = seconds / 60;
  return minutes >= 1 ? Printf("%.1f", minutes) : Printf("%.2g", minutes);
}

// Seconds with three significant digits: 0.00412, 0.317, 2.34, 118.
std::string StepSecondsText(double seconds) {
  if (seconds >= 100) return Printf("%.0f", seconds);
  if (seconds >= 1) return Printf("%.2f", seconds);
  if (seconds >= 0.1) return Printf("%.3f", seconds);
  return Printf("%.2g", seconds);
}

std::string Count(int64_t n) { return Grouped(static_cast<double>(n), 0); }

// --explain's lines of one trial: the model state's formulas, then the activations' and the
// peak's (common/estimate's terms), then the verdict.
std::string Explain(const TrialEstimate& e) {
  const TrialSettings& c = e.trial->config.settings();
  const estimate::StepMemoryEstimate& m = *e.memory;
  const estimate::ModelStateEstimate& s = m.state;
  const std::string precision(Name(c.memory.precision));
  const std::string element = c.memory.precision == trial::Precision::kBf16True ? "2 B" : "4 B";
  const std::string optimizer(Name(c.train.optimizer));
  std::vector<std::vector<std::string>> rows;
  auto add = [&](const std::string& name, const std::string& formula, uint64_t bytes) {
    rows.push_back({"  " + name, formula, FormatBytes(bytes)});
  };
  const std::string per_rank =
      s.world_size > 1 ? " / " + std::to_string(s.world_size) + " ranks" : "";
  const bool sharded = c.parallel.strategy == trial::Strategy::kFsdp && s.world_size > 1;
  const bool full_offload = sharded && c.memory.offload == trial::Offload::kFull;
  add("params",
      full_offload ? "the shards are on the host (optim); the device gathers units (peak)"
                   : Count(s.parameters_total) + " values x " + element +
                         (c.peft.method == trial::PeftMethod::kQlora
                              ? " (NF4 base weights: 0.5 B + block scales)"
                              : "") +
                         (sharded ? per_rank : ""),
      s.params_bytes);
  add("grads",
      full_offload ? "on the host, with the shards (optim)"
      : s.grads_bytes == 0
          ? "none held (each is applied or moved to the host as backward makes it)"
          : Count(s.parameters_trainable) + " trainable x " + element + (sharded ? per_rank : ""),
      s.grads_bytes);
  std::string optim;
  if (full_offload) {
    optim = "on the host: the shards, their gradients and the optimizer's state (" + element +
            " per value each" + per_rank + "), " + FormatBytes(s.optim_host_bytes);
  } else if (s.optim_host_bytes > 0) {
    optim = "on the host: 16 B x " + Count(s.parameters_trainable) +
            " (fp32 weights, moments, gradient) + 4 B, " + FormatBytes(s.optim_host_bytes);
  } else if (optimizer == "adamw") {
    optim = "AdamW: 2 moments x " + Count(s.parameters_trainable) + " x " + element + " + 4 B" +
            (sharded ? per_rank : "");
  } else if (optimizer == "adamw_8bit") {
    optim = "8-bit AdamW: 2 B per value + 8 B per 256 (fp32 for tensors under 4096 values)";
  } else if (optimizer == "sgd") {
    optim = s.optim_device_bytes == 0
                ? "SGD without momentum: none"
                : "SGD momentum: " + Count(s.parameters_trainable) + " x " + element;
  }
  add("optimizer", optim, s.optim_device_bytes);
  if (s.comm_bytes > 0)
    add("comm", std::string(Name(c.parallel.strategy)) + " gradient buffers", s.comm_bytes);
  for (const estimate::EstimateTerm& term : m.terms) add(term.name, term.formula, term.bytes);
  if (e.device) {
    const double share = static_cast<double>(m.peak_bytes) / static_cast<double>(e.device->bytes);
    add("device",
        e.device->source + ": " + (e.Verdict() == "fits" ? "fits, " : "OUT OF MEMORY, ") +
            Printf("%.1f", 100.0 * share) + "% of it",
        e.device->bytes);
  }
  std::string text =
      e.trial->name + " (" + c.model.name + ", " + precision + ", " + optimizer + "):\n";
  text += FormatColumns(rows, /*first_right_aligned=*/2);
  if (e.time) {
    std::vector<std::vector<std::string>> time_rows;
    for (const estimate::TimeTerm& term : e.time->terms) {
      time_rows.push_back(
          {"  " + term.name,
           term.formula + (term.calibrated ? " x " + Printf("%.3f", e.time->factor) : ""),
           StepSecondsText(term.seconds) + " s"});
    }
    time_rows.push_back({"  step",
                         Grouped(static_cast<double>(e.work->tokens), 0) + " tokens a rank (" +
                             std::to_string(e.work->micro_batches) + " micro-batches)",
                         StepSecondsText(e.time->step_seconds) + " s"});
    time_rows.push_back({"  start-up",
                         "process and device, then the model's weights " +
                             std::string(e.work->pretrained ? "loaded" : "built"),
                         StepSecondsText(e.time->startup_seconds) + " s"});
    text += "time on " + e.time_device + " (" + e.calibration + "; at " + RatesText(e.rates) +
            "; x the factor):\n" + FormatColumns(time_rows, /*first_right_aligned=*/2);
  }
  return text;
}

std::vector<std::string> TableHeader(const EstimateOptions& options) {
  std::vector<std::string> header = {"trial",       "model", "ranks",  "tokens", "model state",
                                     "activations", "peak",  "device", "verdict"};
  if (options.fit) header.insert(header.end(), {"max micro-batch", "global as"});
  header.insert(header.end(), {"step s", "tok/s", "minutes"});
  return header;
}

// ranks .. verdict of an estimated trial.
std::vector<std::string> MemoryCells(const TrialEstimate& e) {
  const estimate::StepMemoryEstimate& m = *e.memory;
  const std::string verdict = e.Verdict();
  return {std::to_string(m.state.world_size),
          Count(m.tokens),
          MibText(m.state.device_bytes()),
          MibText(m.activation_bytes),
          MibText(m.peak_bytes),
          e.device ? MibText(e.device->bytes) : std::string(kNone),
          verdict.empty()    ? std::string(kNone)
          : verdict == "oom" ? "OOM"
                             : "fits"};
}

// max micro-batch and global as (--fit).
std::vector<std::string> FitCells(const TrialEstimate& e) {
  if (!e.fit) return {std::string(kNone), std::string(kNone)};
  if (e.fit->micro_batch_size == 0) return {"none", std::string(kNone)};
  return {std::to_string(e.fit->micro_batch_size),
          e.fit->accumulation > 0 ? std::to_string(e.fit->global_micro_batch_size) + " x " +
                                        std::to_string(e.fit->accumulation)
                                  : std::string(kNone)};
}

// step s, tok/s and minutes.
std::vector<std::string> TimeCells(const TrialEstimate& e) {
  if (!e.time) return std::vector<std::string>(3, std::string(kNone));
  return {StepSecondsText(e.time->step_seconds), Grouped(e.time->tokens_per_second, 0),
          e.time->trial_seconds > 0 ? MinutesText(e.time->trial_seconds) : std::string(kNone)};
}

// What the lines under the table say: the devices, calibrations and rates the rows used (each
// once, in the order met) and a note per trial that needs one.
struct TableNotes {
  std::vector<std::string> sources;
  std::vector<std::string> calibrations;
  std::vector<std::string> rates;
  std::string notes;

  static void AddOnce(std::vector<std::string>& list, const std::string& item) {
    if (std::find(list.begin(), list.end(), item) == list.end()) list.push_back(item);
  }

  void Add(const TrialEstimate& e) {
    if (!e.memory) {
      notes += e.trial->name + ": not estimated: " + e.reason + "\n";
      return;
    }
    if (e.time) {
      AddOnce(calibrations, e.calibration);
      AddOnce(rates, RatesText(e.rates));
    } else {
      notes += e.trial->name + ": no time: " + e.time_reason + "\n";
    }
    if (!e.note.empty()) notes += e.trial->name + ": " + e.note + "\n";
    if (e.device) AddOnce(sources, e.device->source);
    if (!e.device) {
      notes += e.trial->name +
               ": no verdict: no device_memory, and no GPU from the target (pass --device-memory "
               "80GiB or a GPU such as a100-80gb)\n";
    }
  }

  std::string Render(const EstimateOptions& options) const {
    std::string text;
    if (!sources.empty()) text += "device: " + Joined(sources) + "\n";
    if (!calibrations.empty()) {
      text +=
          "time: a step (step s) at the mean micro-batch the run draws, else at full sequences, "
          "the trial's tokens/s over its ranks, and minutes for its steps after start-up; "
          "calibration: " +
          Joined(calibrations) + "\nrates: " + Joined(rates) + "\n";
    }
    if (options.fit) {
      text +=
          "max micro-batch: the largest that fits; global as: the trial's global batch as "
          "micro-batch x accumulation with the largest micro-batch that fits and divides it\n";
    }
    return text + notes;
  }

  static std::string Joined(const std::vector<std::string>& items) {
    std::string text;
    for (size_t i = 0; i < items.size(); ++i) text += (i > 0 ? "; " : "") + items[i];
    return text;
  }
};

std::string RenderTable(const std::string& file, const Experiment& experiment,
                        const std::vector<TrialEstimate>& estimates,
                        const EstimateOptions& options) {
  const std::vector<std::string> header = TableHeader(options);
  std::vector<std::vector<std::string>> rows = {header};
  TableNotes notes;
  for (const TrialEstimate& e : estimates) {
    notes.Add(e);
    std::vector<std::string> row = {e.trial->name, e.trial->config.settings().model.name};
    if (!e.memory) {
      row.resize(header.size(), std::string(kNone));
    } else {
      for (const std::vector<std::string>& cells :
           {MemoryCells(e), options.fit ? FitCells(e) : std::vector<std::string>(), TimeCells(e)}) {
        row.insert(row.end(), cells.begin(), cells.end());
      }
    }
    rows.push_back(std::move(row));
  }
  std::string text = "estimate of " + file + " (" + experiment.name +
                     "): per rank on the training device, MiB\n" +
                     FormatColumns(rows, /*first_right_aligned=*/2) + notes.Render(options);
  if (options.explain) {
    for (const TrialEstimate& e : estimates) {
      if (e.memory) text += "\n" + Explain(e);
    }
  }
  return text + kAssumptions + "\n";
}

std::string RenderJson(const std::string& file, const Experiment& experiment,
                       const std::vector<TrialEstimate>& estimates,
                       const EstimateOptions& options) {
  ordered_json out = {{"file", file},
                      {"experiment", experiment.name},
                      {"note", kAssumptions},
                      {"trials", ordered_json::array()}};
  for (const TrialEstimate& e : estimates) {
    ordered_json trial = {{"name", e.trial->name},
                          {"model", e.trial->config.settings().model.name},
                          {"estimated", e.memory.has_value()}};
    if (!e.memory) {
      trial["reason"] = e.reason;
      out["trials"].push_back(trial);
      continue;
    }
    const estimate::StepMemoryEstimate& m = *e.memory;
    const estimate::ModelStateEstimate& b = m.state;
    trial.update(ordered_json{{"world_size", b.world_size},
                              {"parameters_total", b.parameters_total},
                              {"parameters_trainable", b.parameters_trainable},
                              {"params_bytes", b.params_bytes},
                              {"grads_bytes", b.grads_bytes},
                              {"optim_device_bytes", b.optim_device_bytes},
                              {"optim_host_bytes", b.optim_host_bytes},
                              {"comm_bytes", b.comm_bytes},
                              {"model_state_bytes", b.device_bytes()},
                              {"tokens", m.tokens},
                              {"activation_bytes", m.activation_bytes},
                              {"peak_bytes", m.peak_bytes},
                              {"peak_phase", m.peak_phase}});
    if (!e.note.empty()) trial["note"] = e.note;
    if (e.device) {
      trial["device_memory_bytes"] = e.device->bytes;
      trial["device_source"] = e.device->source;
      trial["verdict"] = e.Verdict();
    } else {
      trial["verdict"] = nullptr;
    }
    if (e.time) {
      trial["time"] = {{"device", e.time_device},
                       {"calibration", e.calibration},
                       {"factor", e.time->factor},
                       {"step_seconds", e.time->step_seconds},
                       {"tokens_per_second", e.time->tokens_per_second},
                       {"startup_seconds", e.time->startup_seconds},
                       {"steps", e.time->steps},
                       {"trial_seconds", e.time->trial_seconds},
                       {"work", e.work->ToJson()}};
      // Only with a probe: without one the JSON is as it was (the data sheets' rates).
      if (!e.rates.empty()) trial["time"]["rates"] = e.rates;
    } else {
      trial["time"] = nullptr;
      trial["time_reason"] = e.time_reason;
    }
    if (options.fit && e.fit) {
      trial["fit"] = {{"micro_batch_size", e.fit->micro_batch_size},
                      {"peak_bytes", e.fit->peak_bytes},
                      {"next_peak_bytes", e.fit->next_peak_bytes},
                      {"global_micro_batch_size", e.fit->global_micro_batch_size},
                      {"accumulation", e.fit->accumulation}};
    }
    if (options.explain) {
      ordered_json terms = ordered_json::array();
      for (const estimate::EstimateTerm& t : m.terms) {
        terms.push_back({{"name", t.name}, {"formula", t.formula}, {"bytes", t.bytes}});
      }
      trial["terms"] = terms;
    }
    out["trials"].push_back(trial);
  }
  return out.dump(2) + "\n";
}

}  // namespace

StatusOr<std::vector<TrialPrediction>> PredictTrials(const Experiment& experiment,
                                                     const std::string& file,
                                                     const EstimateOptions& options) {
  std::vector<TrialPrediction> predictions;
  for (const Trial& t : experiment.trials) {
    ASSIGN_OR_RETURN(TrialEstimate e, EstimateTrial(t, experiment, file, options, std::nullopt));
    if (!e.memory) continue;
    predictions.push_back({.trial = t.name,
                           .peak_bytes = e.memory->peak_bytes,
                           .activation_bytes = e.memory->activation_bytes,
                           .model_state_bytes = e.memory->state.device_bytes(),
                           .peak_phase = e.memory->peak_phase,
                           .device_memory_bytes = e.device ? e.device->bytes : 0,
                           .device_source = e.device ? e.device->source : "",
                           .verdict = e.Verdict()});
    if (e.time) {
      TrialPrediction& p = predictions.back();
      p.step_seconds = e.time->step_seconds;
      p.tokens_per_second = e.time->tokens_per_second;
      p.trial_seconds = e.time->trial_seconds;
      p.time_device = e.time_device;
      p.calibration = e.rates.empty() ? e.calibration : e.calibration + "; " + RatesText(e.rates);
      p.work_json = e.work->ToJson().dump();
    }
  }
  return predictions;
}

StatusOr<std::string> EstimateExperiment(const std::string& file, const EstimateOptions& options) {
  if (options.format != "table" && options.format != "json") {
    return InvalidArgumentError("--format: expected table or json, got '" + options.format + "'");
  }
  ASSIGN_OR_RETURN(const std::optional<Device> device_option,
                   ParseDeviceOption(options.device_memory));
  StatusOr<std::string> text = ReadFileToString(file, kMaxExperimentFileBytes);
  if (!text.ok()) return InvalidArgumentError(text.status().message());  // names the file
  // As `llmctl submit` checks it on this machine: the same messages, FILE:LINE:COLUMN.
  ASSIGN_OR_RETURN(Experiment experiment,
                   ParseExperiment(*text, file, {.resolve_local_paths = true}));
  std::vector<TrialEstimate> estimates;
  std::string names;
  for (const Trial& t : experiment.trials) {
    names += (names.empty() ? "" : ", ") + t.name;
    if (!options.trial.empty() && t.name != options.trial) continue;
    ASSIGN_OR_RETURN(TrialEstimate estimate,
                     EstimateTrial(t, experiment, file, options, device_option));
    estimates.push_back(std::move(estimate));
  }
  if (estimates.empty()) {
    return InvalidArgumentError(file + ": no trial named '" + options.trial +
                                "' (trials: " + names + ")");
  }
  return options.format == "json" ? RenderJson(file, experiment, estimates, options)
                                  : RenderTable(file, experiment, estimates, options);
}

}  // namespace llmctl::cli
