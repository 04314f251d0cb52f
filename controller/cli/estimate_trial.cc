#include "controller/cli/estimate_trial.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "common/blip2_config.h"
#include "common/byte_size.h"
#include "common/estimate/blip2_memory.h"
#include "common/estimate/blip2_work.h"
#include "common/inputs/captions.h"
#include "common/inputs/drawn_batches.h"
#include "common/inputs/token_cache.h"
#include "common/inputs/trial_inputs.h"
#include "common/model_config.h"
#include "common/printf.h"
#include "common/text.h"
#include "common/trial_keys.h"
#include "controller/cli/report_format.h"

namespace llmctl::cli {
namespace {

// The trial's own device: its device_memory (the simulated device on the CPU, a budget on a
// GPU), else on cuda the GPU of the experiment's target.
std::optional<VerdictDevice> TrialDevice(const Trial& trial, const Experiment& experiment) {
  const DeviceSettings& device = trial.config.settings().device;
  if (device.memory) {
    return VerdictDevice{device.memory->bytes, "device_memory " + device.memory->text,
                         std::nullopt};
  }
  if (device.kind != trial::Device::kCuda) return std::nullopt;
  std::optional<estimate::Gpu> gpu = estimate::GpuOfTarget(experiment.target);
  if (!gpu) return std::nullopt;
  std::string target;
  for (const auto& [key, value] : experiment.target) {
    if (key == "flavor" || key == "node_type") target = key + " " + value;
  }
  return VerdictDevice{gpu->memory_bytes, "target " + target + ": " + gpu->model, gpu};
}

// The device `trial`'s verdict is made against: --device-memory's when set, else its own; with the
// limit its allocator sets there (a GPU's whole card; else a budget, which on cuda caps the caching
// allocator's reserve and on a known card cannot pass the card's own limit).
std::optional<VerdictDevice> JudgedDevice(const Trial& trial, const Experiment& experiment,
                                          const std::optional<VerdictDevice>& device_option) {
  std::optional<VerdictDevice> device =
      device_option ? device_option : TrialDevice(trial, experiment);
  if (!device) return device;
  if (device->gpu) {
    device->limit = estimate::CudaCardLimit(device->bytes);
  } else if (trial.config.settings().device.kind != trial::Device::kCuda) {
    device->limit = estimate::CpuBudgetLimit(device->bytes);
  } else {
    device->limit = estimate::CudaBudgetLimit(device->bytes);
    if (std::optional<estimate::Gpu> card = estimate::GpuOfTarget(experiment.target)) {
      device->limit = estimate::Tighter(device->limit, estimate::CudaCardLimit(card->memory_bytes));
    }
  }
  return device;
}

// The speed a trial's time is predicted at: the host's CPU for a cpu trial; for a cuda one the GPU
// of --device-memory when it names one, else of the experiment's target, else of --rates' probe.
std::optional<estimate::DeviceSpeed> TrialSpeed(const Trial& trial, const Experiment& experiment,
                                                const std::optional<VerdictDevice>& device_option,
                                                const std::optional<estimate::Gpu>& rates_gpu) {
  if (trial.config.settings().device.kind != trial::Device::kCuda) return estimate::CpuSpeed();
  if (device_option && device_option->gpu) return estimate::GpuSpeed(*device_option->gpu);
  if (std::optional<estimate::Gpu> gpu = estimate::GpuOfTarget(experiment.target)) {
    return estimate::GpuSpeed(*gpu);
  }
  if (rates_gpu) return estimate::GpuSpeed(*rates_gpu);
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
  double real_tokens = 0;       // a micro-batch's mean real tokens; 0 when not drawn
  double new_length_share = 0;  // of the timed micro-batches, at a length new to the run
  // The timed micro-batches by padded length (their attention's), empty when not drawn.
  std::map<int64_t, int64_t> padded_lengths;
  LengthsNote note;
};

StatusOr<DrawnLengths> DrawLengths(const TrialConfig& config, const std::string& context) {
  DrawnLengths lengths{config, std::nullopt, std::nullopt, config, 0, 0, {}, {}};
  const TrialSettings& settings = config.settings();
  const int64_t max_length = settings.data.max_seq_length;
  const std::string& data_path = settings.data.path;
  const StatusOr<std::string> tokenizer = TrialTokenizerPath(config);
  // A tokenizer the file names on this machine that is not there is a mistake `llmctl submit`
  // refuses, not one on the node: it was estimated at full sequences as "not on this machine".
  std::error_code not_here;
  if (tokenizer.ok() && !settings.model.tokenizer.empty() &&
      !IsNodePath(settings.model.tokenizer) && !std::filesystem::exists(*tokenizer, not_here)) {
    return InvalidArgumentError(context + ": tokenizer: " + *tokenizer + ": no such file");
  }
  // A tokenizer path the system will not look up (a 300-character name) is not on this machine.
  if (IsNodePath(data_path) || IsNodePath(settings.model.tokenizer) || !tokenizer.ok() ||
      !std::filesystem::exists(*tokenizer, not_here)) {
    lengths.note = {
        .how = "sequences at data.max_seq_length, the dataset or its tokenizer not on this machine",
        .figures = std::to_string(max_length) + " tokens"};
    return lengths;
  }
  StatusOr<DrawnBatches> drawn = DrawMicroBatches(config);
  if (!drawn.ok()) {
    // The draw reads both inputs; the key is said as submit's check says it. Loading the
    // tokenizer again only on this path costs a successful draw nothing.
    StatusOr<std::unique_ptr<data::TextEncoder>> loaded = LoadTrialTokenizer(config);
    if (!loaded.ok())
      return InvalidArgumentError(context + ": tokenizer: " + loaded.status().message());
    return InvalidArgumentError(context + ": data.path: " + drawn.status().message());
  }
  const int64_t accumulating = drawn->longest_later_accumulating;
  const int64_t opening =
      drawn->longest_later_opening > 0 ? drawn->longest_later_opening : drawn->longest;
  const int64_t later = std::max(accumulating, opening);
  std::string later_text = std::to_string(later) + " tokens";
  if (accumulating > 0 && opening > accumulating) {
    // A longer micro-batch opens a step: estimated as a step of its own (no gradient held yet),
    // beside the longest that accumulates.
    lengths.opening_config = config;
    RETURN_IF_ERROR(lengths.opening_config->Set("data.max_seq_length", opening));
    RETURN_IF_ERROR(lengths.opening_config->Set(
        "train.global_batch_size", settings.train.micro_batch_size * DataParallelRanks(config)));
    RETURN_IF_ERROR(lengths.peak_config.Set("data.max_seq_length", accumulating));
    later_text = std::to_string(accumulating) + " tokens beside held gradients and " +
                 std::to_string(opening) + " opening a step";
  } else {
    RETURN_IF_ERROR(lengths.peak_config.Set("data.max_seq_length", later));
  }
  if (drawn->longest_first_step > later) {
    lengths.first_step_config = config;
    RETURN_IF_ERROR(
        lengths.first_step_config->Set("data.max_seq_length", drawn->longest_first_step));
  }
  RETURN_IF_ERROR(lengths.time_config.Set("data.max_seq_length",
                                          static_cast<int64_t>(std::ceil(drawn->mean_padded))));
  lengths.real_tokens = drawn->mean_real_tokens;
  lengths.new_length_share = drawn->new_length_share;
  lengths.padded_lengths = drawn->timed_padded_lengths;
  std::string walked = std::to_string(drawn->steps);
  if (drawn->walked_steps < drawn->steps) {
    walked = std::string("the first ")
                 .append(std::to_string(drawn->walked_steps))
                 .append(" of its ")
                 .append(walked);
  }
  lengths.note = {
      .how = "sequences as the run draws them with seed " + std::to_string(settings.train.seed) +
             " over " + walked + " steps, data.max_seq_length " + std::to_string(max_length) +
             ": the peak at the longest micro-batch after the first step, the time at the mean "
             "after it (what the report measures)",
      .figures = "peak at " + later_text +
                 (lengths.first_step_config
                      ? " (the first step's " + std::to_string(drawn->longest_first_step) +
                            ", before the optimizer's state exists)"
                      : "") +
                 ", time at " + Printf("%.1f", drawn->mean_padded) + " tokens" +
                 (drawn->timed_padded_lengths.size() > 1
                      ? " (attention over its " +
                            std::to_string(drawn->timed_padded_lengths.size()) + " lengths)"
                      : "")};
  return lengths;
}

// The trial's device as the estimate knows it (TrialSpeed), with the rates `options` measured for
// it in place of the data sheet's: its time's rates and its matmul library's buffers.
std::optional<estimate::DeviceSpeed> MeasuredSpeed(
    const Trial& trial, const Experiment& experiment, const EstimateOptions& options,
    const std::optional<VerdictDevice>& device_option) {
  std::optional<estimate::DeviceSpeed> speed =
      TrialSpeed(trial, experiment, device_option, options.rates_gpu);
  if (speed && options.rates) speed = options.rates(*speed, experiment.target);
  return speed;
}

// The buffers of `speed`'s matmul library, where a probe measured them.
estimate::MatmulBuffers BuffersOf(const std::optional<estimate::DeviceSpeed>& speed) {
  return speed ? speed->matmul_buffers : estimate::MatmulBuffers{};
}

// The trial's time on `speed` (MeasuredSpeed) from its step's `work`, calibrated by `options`; a
// cuda trial without a GPU this table knows is left without one, saying why. InvalidArgument as
// the work's.
Status AddTime(const EstimateOptions& options, const std::optional<estimate::DeviceSpeed>& speed,
               const std::function<StatusOr<estimate::StepWork>()>& work, TrialEstimate& result) {
  const Trial& trial = *result.trial;
  if (!speed) {
    result.time_reason =
        "no GPU to time it on: the target names none this table knows (pass --device-memory "
        "with a GPU such as h100-94gb, or --rates with a probe of one)";
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
  // The canary's seconds the time assumes: the probe's, at the machine's usual pace where stored
  // runs measured one (the report sets the steps' own against it).
  result.pace_seconds = speed->pace_seconds / result.time->pace;
  return Status::Ok();
}

// What a BLIP-2 trial's caption set on this machine tells its estimate, the set read once.
struct CaptionSetFacts {
  // The memory's: the longest caption; none without the set (data.max_seq_length then).
  std::optional<int64_t> caption_tokens;
  // The time's: a micro-batch's mean padded caption and real tokens (queries and caption) over the
  // steps the report measures, as the run draws them; none without the set.
  std::optional<int64_t> time_caption_tokens;
  double real_tokens = 0;
  // The source pixels of an image the run decodes, by format; none without the set.
  ImagePixels image_pixels;
  LengthsNote note;  // what the estimate's captions are
};

// The trial's caption set, when it and its tokenizer are on this machine. Errors name the file.
StatusOr<CaptionSetFacts> ReadCaptionSet(const Trial& trial, const Blip2Config& model) {
  const TrialSettings& settings = trial.config.settings();
  CaptionSetFacts facts;
  const std::string& data_path = settings.data.path;
  const std::string& tokenizer = settings.model.tokenizer;
  // Without `tokenizer` a hub model's own is read, on the node.
  if (IsNodePath(data_path) || IsNodePath(tokenizer) ||
      (tokenizer.empty() && IsHubModelRef(settings.model.name))) {
    facts.note = {
        .how =
            "captions at data.max_seq_length, the caption set or its tokenizer not on this "
            "machine",
        .figures = std::to_string(settings.data.max_seq_length) + " tokens"};
    return facts;
  }
  ASSIGN_OR_RETURN(const std::vector<image::CaptionedImage> images, ReadTrialImages(trial.config));
  ASSIGN_OR_RETURN(const CaptionTokenSpan span, CaptionTokens(trial.config, model, images));
  facts.caption_tokens = span.longest;
  ASSIGN_OR_RETURN(const DrawnBatches drawn, DrawCaptionBatches(trial.config, model, images));
  const int64_t queries = model.num_query_tokens;
  facts.time_caption_tokens =
      std::max<int64_t>(1, static_cast<int64_t>(std::ceil(drawn.mean_padded)) - queries);
  facts.real_tokens = drawn.mean_real_tokens;
  ASSIGN_OR_RETURN(facts.image_pixels, MeanImagePixels(trial.config, images));
  facts.note = {
      .how = "captions at the longest of " + data_path +
             "; the time at the mean micro-batch after the first step as the run draws them with "
             "seed " +
             std::to_string(settings.train.seed),
      .figures =
          "peak at " + std::to_string(span.longest) + " tokens, time at " +
          Printf("%.1f", drawn.mean_padded - static_cast<double>(queries)) + " caption tokens (" +
          Printf("%.1f", facts.real_tokens) + " tokens a micro-batch, its " +
          std::to_string(queries * settings.train.micro_batch_size) + " query places included)"};
  return facts;
}

// The step's work at the mean micro-batch the run draws (what the report measures), else at the
// captions the memory is estimated at.
StatusOr<estimate::StepWork> Blip2TimeWork(const Trial& trial, const Blip2Config& model,
                                           const CaptionSetFacts& captions) {
  ASSIGN_OR_RETURN(
      estimate::StepWork work,
      estimate::EstimateBlip2StepWork(
          trial.config, model,
          captions.time_caption_tokens ? captions.time_caption_tokens : captions.caption_tokens));
  // Tokens/s counts real tokens, as the trainer does.
  if (captions.real_tokens > 0) {
    work.tokens = static_cast<int64_t>(captions.real_tokens) * work.micro_batches;
  }
  // Each example's image, decoded on this rank's host.
  const double images =
      static_cast<double>(trial.config.settings().train.micro_batch_size * work.micro_batches);
  work.jpeg_pixels = images * captions.image_pixels.jpeg;
  work.png_pixels = images * captions.image_pixels.png;
  return work;
}

// A BLIP-2 trial (data.format imagefolder): common/estimate/blip2_memory.h's memory, with the
// captions at the longest of a caption set on this machine, read with the trial's tokenizer (the
// trainer pads a micro-batch to its longest row), else at data.max_seq_length. A model on the hub
// is estimated when its name is a preset's, whose shapes are the hub's config.json. Its time is
// counted at the same captions (common/estimate/blip2_work.h).
StatusOr<TrialEstimate> EstimateBlip2Trial(const Trial& trial, const Experiment& experiment,
                                           const std::string& file, const EstimateOptions& options,
                                           const std::optional<VerdictDevice>& device_option) {
  const std::string& model_name = trial.config.settings().model.name;
  const std::string context = file + ": trial '" + OnOneLine(trial.name) + "'";
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
  StatusOr<CaptionSetFacts> captions = ReadCaptionSet(trial, **model);
  if (!captions.ok()) return InvalidArgumentError(context + ": " + captions.status().message());
  // The rates first: a probe's matmul buffers are the memory's too.
  const std::optional<estimate::DeviceSpeed> speed =
      MeasuredSpeed(trial, experiment, options, device_option);
  const estimate::MatmulBuffers buffers = BuffersOf(speed);
  StatusOr<estimate::StepMemoryEstimate> memory =
      estimate::EstimateBlip2StepMemory(trial.config, **model, captions->caption_tokens, buffers);
  if (!memory.ok()) return InvalidArgumentError(context + ": " + memory.status().message());
  TrialEstimate result{.trial = &trial,
                       .memory = *memory,
                       .device = JudgedDevice(trial, experiment, device_option),
                       .note = captions->note};
  RETURN_IF_ERROR(AddTime(
                      options, speed,
                      [&]() -> StatusOr<estimate::StepWork> {
                        return Blip2TimeWork(trial, **model, *captions);
                      },
                      result)
                      .WithContext(context));
  if (options.fit && result.device) {
    StatusOr<estimate::MicroBatchFit> fit = estimate::FitBlip2MicroBatch(
        trial.config, **model, captions->caption_tokens, result.device->limit.safe_bytes, buffers);
    if (!fit.ok()) return InvalidArgumentError(context + ": " + fit.status().message());
    result.fit = *fit;
  }
  return result;
}

}  // namespace

std::string KnownGpuNames() {
  std::string names;
  for (const estimate::Gpu& gpu : estimate::KnownGpus()) {
    names.append(names.empty() ? "" : ", ").append(gpu.name);
  }
  return names;
}

StatusOr<std::optional<VerdictDevice>> ParseDeviceOption(const std::string& text) {
  if (text.empty()) return std::optional<VerdictDevice>();
  if (std::optional<estimate::Gpu> gpu = estimate::GpuNamed(text)) {
    return std::optional<VerdictDevice>(VerdictDevice{
        gpu->memory_bytes, "--device-memory " + gpu->name + " (" + gpu->model + ")", gpu});
  }
  StatusOr<uint64_t> bytes = ParseByteSize(text);
  if (!bytes.ok() || *bytes == 0) {
    return InvalidArgumentError("--device-memory: expected a size such as 80GiB or a GPU (" +
                                KnownGpuNames() + "), got '" + text + "'");
  }
  return std::optional<VerdictDevice>(
      VerdictDevice{*bytes, "--device-memory " + text, std::nullopt});
}

StatusOr<TrialEstimate> EstimateTrial(const Trial& trial, const Experiment& experiment,
                                      const std::string& file, const EstimateOptions& options,
                                      const std::optional<VerdictDevice>& device_option) {
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
  const std::string context = file + ": trial '" + OnOneLine(trial.name) + "'";
  // Parsing resolved the model's path beside the file; a directory without a readable config.json
  // is the caller's to fix, as for `llmctl submit`.
  StatusOr<ModelConfig> model = ResolveModel(model_name);
  if (!model.ok()) return InvalidArgumentError(context + ": model: " + model.status().message());
  // The lengths the run will draw, when its data and tokenizer are on this machine: the peak at
  // its longest micro-batch, the time at its mean one.
  ASSIGN_OR_RETURN(const DrawnLengths drawn, DrawLengths(trial.config, context));
  const std::optional<estimate::DeviceSpeed> speed =
      MeasuredSpeed(trial, experiment, options, device_option);
  const estimate::MatmulBuffers buffers = BuffersOf(speed);
  StatusOr<estimate::StepMemoryEstimate> memory =
      estimate::EstimateStepMemory(drawn.peak_config, *model, buffers);
  if (!memory.ok()) return InvalidArgumentError(context + ": " + memory.status().message());
  if (drawn.opening_config) {
    StatusOr<estimate::StepMemoryEstimate> opening =
        estimate::EstimateStepMemory(*drawn.opening_config, *model, buffers);
    if (!opening.ok()) return InvalidArgumentError(context + ": " + opening.status().message());
    if (opening->peak_bytes > memory->peak_bytes) memory = std::move(opening);
  }
  if (drawn.first_step_config) {
    // The first step's longer micro-batch, less the optimizer's state its forward and backward
    // run without (its optimizer step holds the state, as every later one does).
    StatusOr<estimate::StepMemoryEstimate> first =
        estimate::EstimateStepMemory(*drawn.first_step_config, *model, buffers);
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
                       .device = JudgedDevice(trial, experiment, device_option),
                       .note = drawn.note};
  RETURN_IF_ERROR(AddTime(
                      options, speed,
                      [&]() -> StatusOr<estimate::StepWork> {
                        ASSIGN_OR_RETURN(estimate::StepWork work,
                                         estimate::EstimateStepWork(drawn.time_config, *model));
                        // Tokens/s counts real tokens, as the trainer does.
                        if (drawn.real_tokens > 0) {
                          work.tokens =
                              static_cast<int64_t>(drawn.real_tokens) * work.micro_batches;
                        }
                        work.new_length_micro_batches =
                            drawn.new_length_share * static_cast<double>(work.micro_batches);
                        estimate::SpreadAttentionOverLengths(drawn.padded_lengths, work);
                        return work;
                      },
                      result)
                      .WithContext(context));
  if (options.fit && result.device) {
    StatusOr<estimate::MicroBatchFit> fit =
        estimate::FitMicroBatch(trial.config, *model, result.device->limit.safe_bytes, buffers);
    if (!fit.ok()) return InvalidArgumentError(context + ": " + fit.status().message());
    result.fit = *fit;
  }
  return result;
}

}  // namespace llmctl::cli
