#include "common/estimate/plan_search.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <string_view>
#include <utility>

#include "common/byte_size.h"
#include "common/estimate/blip2_memory.h"
#include "common/estimate/blip2_work.h"

namespace llmctl::estimate {
namespace {

// One point of the space before its micro-batch is chosen.
struct Combination {
  std::string precision;
  std::string optimizer;
  std::string peft;
  bool checkpointing = false;
  std::string strategy;  // "auto", "ddp", "fsdp"
  std::string offload;   // "none", "optimizer", "full"

  std::string Name() const {
    std::string name = precision + "-" + optimizer;
    if (peft != "none") name += "-" + peft;
    if (checkpointing) name += "-ckpt";
    if (strategy != "auto") name += "-" + strategy;
    if (offload != "none") name += "-offload-" + offload;
    return name;
  }
};

std::vector<Combination> Combinations(const PlanSpace& space, int64_t ranks) {
  // One process: offload of the optimizer's step; several: ddp (each rank whole, the optimizer
  // offloadable) or fsdp (sharded, everything offloadable to the host).
  std::vector<std::pair<std::string, std::string>> layouts;
  if (ranks == 1) {
    layouts = {{"auto", "none"}};
    if (space.offload) layouts.push_back({"auto", "optimizer"});
  } else {
    layouts = {{"ddp", "none"}, {"fsdp", "none"}};
    if (space.offload) layouts.insert(layouts.end(), {{"ddp", "optimizer"}, {"fsdp", "full"}});
  }
  std::vector<Combination> all;
  for (const std::string& precision : space.precisions) {
    for (const std::string& optimizer : space.optimizers) {
      for (const std::string& peft : space.peft_methods) {
        for (bool checkpointing : space.checkpointing) {
          for (const auto& [strategy, offload] : layouts) {
            all.push_back({precision, optimizer, peft, checkpointing, strategy, offload});
          }
        }
      }
    }
  }
  return all;
}

// The estimates of either family, on a device whose matmul library takes `buffers`.
StatusOr<MicroBatchFit> Fit(const TrialConfig& config, const PlanModel& model,
                            uint64_t device_bytes, const MatmulBuffers& buffers) {
  if (const Blip2Config* blip2 = std::get_if<Blip2Config>(&model.shapes)) {
    return FitBlip2MicroBatch(config, *blip2, model.caption_tokens, device_bytes, buffers);
  }
  return FitMicroBatch(config, std::get<ModelConfig>(model.shapes), device_bytes, buffers);
}

StatusOr<StepMemoryEstimate> Memory(const TrialConfig& config, const PlanModel& model,
                                    const MatmulBuffers& buffers) {
  if (const Blip2Config* blip2 = std::get_if<Blip2Config>(&model.shapes)) {
    return EstimateBlip2StepMemory(config, *blip2, model.caption_tokens, buffers);
  }
  return EstimateStepMemory(config, std::get<ModelConfig>(model.shapes), buffers);
}

StatusOr<StepWork> Work(const TrialConfig& config, const PlanModel& model) {
  if (const Blip2Config* blip2 = std::get_if<Blip2Config>(&model.shapes)) {
    return EstimateBlip2StepWork(config, *blip2, model.caption_tokens);
  }
  return EstimateStepWork(config, std::get<ModelConfig>(model.shapes));
}

Status Apply(const Combination& c, TrialConfig& config) {
  RETURN_IF_ERROR(config.SetFromText("precision", c.precision));
  RETURN_IF_ERROR(config.SetFromText("optimizer", c.optimizer));
  RETURN_IF_ERROR(config.SetFromText("peft.method", c.peft));
  RETURN_IF_ERROR(config.Set("activation_checkpointing", c.checkpointing));
  RETURN_IF_ERROR(config.SetFromText("strategy", c.strategy));
  return config.SetFromText("offload", c.offload);
}

// Every combination dropped with one and the same trainer's refusal: the fault is the base's (such
// as `--set data.path=`, which no precision or optimizer mends), said once rather than as the
// reason of each of the 72 configurations searched.
Status RefuseABaseNoCombinationMends(const Plan& plan) {
  constexpr std::string_view kInvalid = "not a valid configuration: ";
  if (!plan.fits.empty() || plan.dropped.empty()) return Status::Ok();
  const std::string& reason = plan.dropped.front().reason;
  if (!reason.starts_with(kInvalid)) return Status::Ok();
  for (const PlanDrop& drop : plan.dropped) {
    if (drop.reason != reason) return Status::Ok();
  }
  return InvalidArgumentError("plan: no configuration is valid: " + reason.substr(kInvalid.size()));
}

}  // namespace

StatusOr<Plan> SearchPlans(const PlanRequest& request) {
  if (request.steps <= 0) return InvalidArgumentError("plan: the run needs a number of steps");
  const TrialSettings& base = request.base.settings();
  const int64_t global = base.train.global_batch_size;
  if (global <= 0) return InvalidArgumentError("plan: the global batch must be positive");
  const int64_t ranks =
      std::max<int64_t>(1, base.device.count) * std::max<int64_t>(1, base.parallel.nodes);
  if (global % ranks != 0) {
    return InvalidArgumentError("plan: the global batch " + std::to_string(global) +
                                " does not divide over " + std::to_string(ranks) + " ranks");
  }
  Plan plan;
  for (const Combination& c : Combinations(request.space, ranks)) {
    ++plan.searched;
    TrialConfig config = request.base;
    Status applied = Apply(c, config);
    // The search starts from the whole global batch in one micro-batch per rank; FitMicroBatch
    // then finds the largest that fits.
    if (applied.ok()) {
      applied = config.Set("train.micro_batch_size", global / ranks);
    }
    if (!applied.ok()) {
      plan.dropped.push_back({c.Name(), "not a valid configuration: " + applied.message(), ""});
      continue;
    }
    StatusOr<MicroBatchFit> fit =
        Fit(config, request.model, request.device_bytes, request.speed.matmul_buffers);
    if (!fit.ok()) {
      plan.dropped.push_back(
          {c.Name(), "not a valid configuration: " + fit.status().message(), ""});
      continue;
    }
    if (fit->micro_batch_size == 0) {
      plan.dropped.push_back({c.Name(),
                              "out of memory at micro-batch 1 (its peak; the device has " +
                                  FormatBytes(request.device_bytes) + ")",
                              FormatBytes(fit->peak_bytes)});
      continue;
    }
    if (fit->global_micro_batch_size == 0) {
      plan.dropped.push_back({c.Name(), "no micro-batch that fits divides the global batch", ""});
      continue;
    }
    // The micro-batch that fits and divides the global batch, with its accumulation.
    PlanCandidate candidate;
    candidate.name = c.Name() + "-mb" + std::to_string(fit->global_micro_batch_size);
    candidate.config = config;
    RETURN_IF_ERROR(candidate.config.Set("train.micro_batch_size", fit->global_micro_batch_size));
    ASSIGN_OR_RETURN(candidate.memory,
                     Memory(candidate.config, request.model, request.speed.matmul_buffers));
    ASSIGN_OR_RETURN(const StepWork work, Work(candidate.config, request.model));
    candidate.time = EstimateTime(work, request.speed, request.calibration, request.steps);
    if (request.budget_seconds > 0 && candidate.time.trial_seconds > request.budget_seconds) {
      plan.dropped.push_back(
          {candidate.name, "over the time budget (its predicted minutes)",
           std::to_string(static_cast<int64_t>(std::ceil(candidate.time.trial_seconds / 60)))});
      continue;
    }
    plan.fits.push_back(std::move(candidate));
  }
  RETURN_IF_ERROR(RefuseABaseNoCombinationMends(plan));
  std::stable_sort(plan.fits.begin(), plan.fits.end(),
                   [](const PlanCandidate& a, const PlanCandidate& b) {
                     // Within 0.5% of each other the time does not decide: the smaller peak does.
                     if (std::abs(a.time.trial_seconds - b.time.trial_seconds) >
                         0.005 * std::max(a.time.trial_seconds, b.time.trial_seconds)) {
                       return a.time.trial_seconds < b.time.trial_seconds;
                     }
                     return a.memory.peak_bytes < b.memory.peak_bytes;
                   });
  return plan;
}

}  // namespace llmctl::estimate
