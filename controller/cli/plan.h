// `llmctl plan MODEL --device GPU|cpu --seq N --global-batch N (--steps N | --tokens N) ...`:
// which configuration of a fine-tuning run fits a device and which is fastest, before anything is
// reserved (common/estimate/plan_search.h searches; this renders, and with --write emits the top
// rows as an experiment file that `llmctl submit` runs as it stands).
#ifndef LLMCTL_CONTROLLER_CLI_PLAN_H_
#define LLMCTL_CONTROLLER_CLI_PLAN_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "common/estimate/step_time.h"
#include "common/status.h"

namespace llmctl::cli {

struct PlanOptions {
  std::string model;          // a preset name or a local model directory (config.json)
  std::string device;         // a GPU of common/estimate/gpus.h, or "cpu"
  std::string device_memory;  // a size: the budget (required for cpu; on a GPU a cap below it)
  int64_t gpus = 1;           // devices per node (ranks per node on the CPU)
  int64_t nodes = 1;
  int64_t seq = 0;              // data.max_seq_length
  int64_t global_batch = 0;     // train.global_batch_size
  int64_t steps = 0;            // the run's optimizer steps, or
  int64_t tokens = 0;           // its tokens (steps = ceil(tokens / (global batch x seq)))
  double budget_hours = 0;      // > 0: drop configurations predicted to take longer
  double su_per_node_hour = 0;  // > 0: service units of each configuration
  std::string precisions = "bf16-true,bf16-mixed,32-true";
  std::string optimizers = "adamw,adamw_8bit";
  std::string peft = "none,lora,qlora";
  bool no_offload = false;
  std::vector<std::string> sets;  // KEY=VALUE fixed on every configuration
  int64_t top = 10;
  std::string write;  // an experiment file of the top rows
  std::string data;   // its data.path (required with --write)
  // Its tokenizer (a tokenizer.json or its directory), where the model's directory has none.
  std::string tokenizer;
  std::string init;  // its init: default pretrained for a published preset, else random
  std::string format = "table";
  // The calibration of a device's time; unset: the built-in one.
  estimate::CalibrationLookup calibrate;
  // The rates of a device's time (a probe's); unset: its data sheet's.
  estimate::SpeedLookup rates;
};

// The plan, as text (table or json). InvalidArgument (exit 2) for a bad flag, naming it and what
// it takes; an unreadable model; --write without --data or to an unwritable path, or of a file
// whose inputs `llmctl submit` would refuse (CollectInputs, CheckLocalInputs): nothing is written
// then, and the message names the flag that supplies what is missing.
StatusOr<std::string> PlanRun(const PlanOptions& options);

}  // namespace llmctl::cli

#endif  // LLMCTL_CONTROLLER_CLI_PLAN_H_
