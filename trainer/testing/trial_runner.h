// Test support: runs a trial of experiments/demo.yaml (with overrides) in this process and reads
// back its event log.
#ifndef LLMCTL_TRAINER_TESTING_TRIAL_RUNNER_H_
#define LLMCTL_TRAINER_TESTING_TRIAL_RUNNER_H_

#include <torch/torch.h>

#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "common/trial_config.h"
#include "trainer/train/trainer.h"

namespace llmctl::trainer::testing {

// The source tree as a string: llmctl::testing::SourceDir() (tests/support/shell_command.h), which
// reads LLMCTL_SOURCE_DIR, set by ctest or by a test binary run on its own.
std::string SourceDir();

// experiments/demo.yaml's trial with `overrides` applied as `--set key=value` would; fails the test
// on a bad override.
TrialConfig DemoConfig(const std::vector<std::pair<std::string, std::string>>& overrides);

struct TrialRecord {
  TrialResult result;
  std::vector<nlohmann::json> events;

  std::vector<nlohmann::json> OfType(const std::string& type) const;
  // The snapshot of (step, micro_batch, phase); fails the test when absent.
  nlohmann::json Snapshot(int64_t step, int64_t micro_batch, const std::string& phase) const;
  std::vector<double> Losses() const;
};

// Runs the trial (continuing from `resume_from` when given) and reads its event log back.
TrialRecord RunAndRecord(const TrialConfig& config, const std::string& resume_from = "");
// The same with `options`, whose events_path is replaced by a temporary file.
TrialRecord RunAndRecord(const TrialConfig& config, RunOptions options);

// Every tensor of tests/fixtures/<relative_path> (a safetensors file), copied out of the mapping;
// fails the test when the file cannot be read.
std::map<std::string, torch::Tensor> LoadTensorFixture(const std::string& relative_path);

// A fresh empty directory under the system's temporary directory, unique to this process.
std::string FreshTempDir(const std::string& name);

}  // namespace llmctl::trainer::testing

#endif  // LLMCTL_TRAINER_TESTING_TRIAL_RUNNER_H_
