// Which configuration to run: the napkin-math talk's question (shared/seeds/napkin-math-fine-
// tuning.md) answered by search. Given a model, a device and a batch, every combination of
// precision x optimizer x checkpointing x offload x PEFT x strategy is estimated (memory,
// step_memory.h; time, step_time.h) at the largest micro-batch that fits the device and divides the
// global batch; those that fit are ranked fastest first, the others kept with the reason they were
// dropped. No LibTorch: `llmctl plan` uses it.
#ifndef LLMCTL_COMMON_ESTIMATE_PLAN_SEARCH_H_
#define LLMCTL_COMMON_ESTIMATE_PLAN_SEARCH_H_

#include <cstdint>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "common/blip2_config.h"
#include "common/estimate/step_memory.h"
#include "common/estimate/step_time.h"
#include "common/model_config.h"
#include "common/status.h"
#include "common/trial_config.h"

namespace llmctl::estimate {

struct PlanSpace {
  std::vector<std::string> precisions = {"bf16-true", "bf16-mixed", "32-true"};
  std::vector<std::string> optimizers = {"adamw", "adamw_8bit"};
  std::vector<std::string> peft_methods = {"none", "lora", "qlora"};
  std::vector<bool> checkpointing = {false, true};
  bool offload = true;  // also try offload: optimizer (one process, ddp) and full (fsdp)
};

// The model a plan is for: the LLaMA family's shapes, or BLIP-2's with its captions' length
// (nullopt: data.max_seq_length).
struct PlanModel {
  std::variant<ModelConfig, Blip2Config> shapes;
  std::optional<int64_t> caption_tokens;
};

struct PlanRequest {
  // The settings every candidate shares: model, data.max_seq_length, train.global_batch_size,
  // device, devices, nodes, and anything else the caller fixes (kernels, peft.r, ...).
  TrialConfig base;
  PlanModel model;
  uint64_t device_bytes = 0;
  DeviceSpeed speed;
  Calibration calibration;
  int64_t steps = 0;          // optimizer steps of the run (> 0)
  double budget_seconds = 0;  // > 0: drop candidates predicted to take longer
  PlanSpace space;
};

struct PlanCandidate {
  std::string name;    // "bf16-true-adamw-ckpt-mb8": precision, optimizer, techniques, micro-batch
  TrialConfig config;  // base + the candidate's keys, micro-batch included
  StepMemoryEstimate memory;
  TimeEstimate time;
};

struct PlanDrop {
  std::string name;    // without a micro-batch when none fits
  std::string reason;  // shared by the configurations dropped alike: "out of memory at ..."
  std::string detail;  // this configuration's figure: its peak, its time; "" when none
};

struct Plan {
  std::vector<PlanCandidate> fits;  // fastest first
  std::vector<PlanDrop> dropped;
  int64_t searched = 0;
};

// Searches `request`'s space. InvalidArgument when the base itself is unusable (no global batch,
// no steps, a model too large to count, or every combination refused for one reason); a
// combination the trainer would refuse is dropped with its reason, not an error.
StatusOr<Plan> SearchPlans(const PlanRequest& request);

}  // namespace llmctl::estimate

#endif  // LLMCTL_COMMON_ESTIMATE_PLAN_SEARCH_H_
