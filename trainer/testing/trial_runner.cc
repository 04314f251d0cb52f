#include "trainer/testing/trial_runner.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <utility>

#include "common/experiment.h"
#include "common/safetensors/safetensors.h"
#include "tests/support/shell_command.h"
#include "trainer/model/weights.h"

namespace llmctl::trainer::testing {

std::string SourceDir() { return llmctl::testing::SourceDir().string(); }

TrialConfig DemoConfig(const std::vector<std::pair<std::string, std::string>>& overrides) {
  auto experiment = LoadExperimentFile(SourceDir() + "/experiments/demo.yaml");
  EXPECT_TRUE(experiment.ok()) << experiment.status().ToString();
  if (!experiment.ok()) return TrialConfig();
  TrialConfig config = experiment->trials.front().config;
  for (const auto& [key, value] : overrides) {
    Status status = config.SetFromText(key, value);
    EXPECT_TRUE(status.ok()) << key << "=" << value << ": " << status.ToString();
  }
  return config;
}

std::vector<nlohmann::json> TrialRecord::OfType(const std::string& type) const {
  std::vector<nlohmann::json> matching;
  for (const auto& event : events) {
    if (event.value("type", "") == type) matching.push_back(event);
  }
  return matching;
}

nlohmann::json TrialRecord::Snapshot(int64_t step, int64_t micro_batch,
                                     const std::string& phase) const {
  for (const auto& event : OfType("snapshot")) {
    if (event["step"] == step && event["micro_batch"] == micro_batch && event["phase"] == phase) {
      return event;
    }
  }
  ADD_FAILURE() << "no snapshot for step " << step << ", micro-batch " << micro_batch << ", "
                << phase;
  return nlohmann::json::object();
}

std::vector<double> TrialRecord::Losses() const {
  std::vector<double> losses;
  for (const auto& event : OfType("step")) losses.push_back(event["loss"].get<double>());
  return losses;
}

TrialRecord RunAndRecord(const TrialConfig& config, const std::string& resume_from) {
  RunOptions options;
  options.resume_from = resume_from;
  return RunAndRecord(config, std::move(options));
}

TrialRecord RunAndRecord(const TrialConfig& config, RunOptions options) {
  const std::filesystem::path path =
      std::filesystem::temp_directory_path() /
      ("llmctl-test-events-" + std::to_string(::getpid()) + ".jsonl");
  std::filesystem::remove(path);
  options.events_path = path.string();
  TrialRecord record;
  record.result = RunTrial(config, options);
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) record.events.push_back(nlohmann::json::parse(line));
  std::filesystem::remove(path);
  return record;
}

std::map<std::string, torch::Tensor> LoadTensorFixture(const std::string& relative_path) {
  auto file = safetensors::SafetensorsFile::Open(SourceDir() + "/tests/fixtures/" + relative_path);
  EXPECT_TRUE(file.ok()) << file.status().ToString();
  std::map<std::string, torch::Tensor> tensors;
  if (!file.ok()) return tensors;
  for (const safetensors::TensorView& view : (*file)->tensors()) {
    tensors[view.name] = TensorFromView(view).clone();
  }
  return tensors;
}

std::string FreshTempDir(const std::string& name) {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() /
                                    ("llmctl-test-" + name + "-" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir.string();
}

}  // namespace llmctl::trainer::testing
