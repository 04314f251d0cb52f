// The memory-saving techniques end to end on small models: `loss: chunked_ce`, `offload: optimizer`
// and `optimizer_in_backward`. Each test runs in its own process (ctest runs each discovered test
// alone), so allocator figures are not shared between tests.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <map>

#include "common/model_config.h"
#include "common/rank_files.h"
#include "trainer/testing/trial_runner.h"
#include "trainer/train/checkpoints.h"
#include "trainer/train/trainer.h"

namespace llmctl::trainer {
namespace {

using testing::DemoConfig;
using testing::RunAndRecord;
using testing::TrialRecord;

uint64_t DemoParameterCount() {
  const ModelConfig* preset = FindPreset("llmctl-demo");
  EXPECT_NE(preset, nullptr);
  return preset ? ParameterCount(*preset) : 0;
}

uint64_t Field(const nlohmann::json& snapshot, const char* name) {
  return snapshot[name].get<uint64_t>();
}

void ExpectSameLosses(const TrialRecord& a, const TrialRecord& b, double tolerance) {
  ASSERT_EQ(a.result.outcome, Outcome::kOk) << a.result.error;
  ASSERT_EQ(b.result.outcome, Outcome::kOk) << b.result.error;
  const std::vector<double> x = a.Losses(), y = b.Losses();
  ASSERT_EQ(x.size(), y.size());
  for (size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(x[i], y[i], tolerance) << "step " << i;
}

// --- loss: chunked_ce --------------------------------------------------------------------------

// The demo model's shape with a LLaMA-sized vocabulary, as a model directory (random init).
std::string Vocab32000ModelDir() {
  ModelConfig config = *FindPreset("llmctl-demo");
  config.vocab_size = 32000;
  const std::string dir = testing::FreshTempDir("vocab32000");
  std::ofstream(dir + "/config.json") << ToHfConfigJson(config).dump();
  return dir;
}

// Micro-batch 4 x 128 tokens at V = 32000: the full fp32 logits are 4·128·32000·4 = 62.5 MiB, and
// the plain path holds them, their log-softmax and, in backward, their gradient. Measured peaks:
// 220.2 MB plain, 140.0 MB chunked (80.2 MB less; the rest is 19.3 MB of parameters, as much
// gradients, twice that of AdamW state, activations and one chunk's logits), at about the same
// speed (214 and 239 tokens/s on a shared 2-core CPU).
TEST(ChunkedLossTest, Vocab32000PeakDropsByMoreThanTheFullLogits) {
  const std::string model = Vocab32000ModelDir();
  auto run_with = [&model](const std::string& loss) {
    return RunAndRecord(DemoConfig({{"model", model},
                                    {"train.max_steps", "2"},
                                    {"train.micro_batch_size", "4"},
                                    {"train.global_batch_size", "4"},
                                    {"loss", loss}}));
  };
  TrialRecord plain = run_with("ce");
  TrialRecord chunked = run_with("chunked_ce");
  ExpectSameLosses(plain, chunked, 1e-4);
  const uint64_t logits_bytes = 4ull * 128 * 32000 * 4;
  EXPECT_GE(plain.result.peak_bytes, chunked.result.peak_bytes + logits_bytes);
  std::filesystem::remove_all(model);
}

TEST(ChunkedLossTest, SameLossesAsThePlainPathInBf16True) {
  auto run_with = [](const std::string& loss) {
    return RunAndRecord(
        DemoConfig({{"train.max_steps", "2"}, {"precision", "bf16-true"}, {"loss", loss}}));
  };
  ExpectSameLosses(run_with("ce"), run_with("chunked_ce"), 2e-2);
}

// --- offload: optimizer
// ----------------------------------------------------------------------------

// fp32 master weights, exp_avg, exp_avg_sq and gradient buffers on the host, 4 bytes each per
// parameter, plus the 4-byte step counter; nothing of the optimizer on the device, and no device
// gradient left after any backward.
TEST(OffloadTest, SnapshotsShowTheOptimizerStateOnTheHost) {
  TrialRecord run = RunAndRecord(DemoConfig({{"train.max_steps", "2"}, {"offload", "optimizer"}}));
  ASSERT_EQ(run.result.outcome, Outcome::kOk) << run.result.error;
  const uint64_t params = 4 * DemoParameterCount();
  for (const auto& snapshot : run.OfType("snapshot")) {
    EXPECT_EQ(Field(snapshot, "params_bytes"), params) << snapshot.dump();
    EXPECT_EQ(Field(snapshot, "optim_device_bytes"), 0u) << snapshot.dump();
    EXPECT_EQ(Field(snapshot, "optim_host_bytes"), 4 * params + 4) << snapshot.dump();
    if (snapshot["phase"] != "phase1_after_fwd") {
      EXPECT_EQ(Field(snapshot, "grads_bytes"), 0u) << snapshot.dump();
    }
  }
  const nlohmann::json s = run.Snapshot(1, 1, "phase3_after_opt_step");
  EXPECT_EQ(Field(s, "allocated_bytes"), params + Field(s, "other_bytes"));
}

// Two micro-batches per step (demo's accumulation): host buffers add them up like .grad does.
TEST(OffloadTest, SameLossesAsPlainAdamW) {
  auto run_with = [](const std::string& offload) {
    return RunAndRecord(DemoConfig({{"train.max_steps", "3"}, {"offload", offload}}));
  };
  ExpectSameLosses(run_with("none"), run_with("optimizer"), 1e-5);
}

// Plain AdamW holds params + grads + moments (16 bytes per parameter) on the device, offload only
// the params (4) and one gradient at a time. Measured peaks without a budget, with the ATen
// decoder block (kernels: aten; the fused one keeps less, and plain AdamW fits): 38.9 MB plain
// (step 1's second backward, with the moments), 32.5 MB offload (step 0's first backward: params
// and activations); the 35 MiB (36.7 MB) budget lies between them.
TEST(OffloadTest, FitsABudgetPlainAdamWRunsOutOf) {
  auto run_with = [](const std::string& offload) {
    return RunAndRecord(DemoConfig({{"train.max_steps", "3"},
                                    {"device_memory", "35MiB"},
                                    {"kernels", "aten"},
                                    {"offload", offload}}));
  };
  TrialRecord plain = run_with("none");
  TrialRecord offloaded = run_with("optimizer");
  EXPECT_EQ(plain.result.outcome, Outcome::kOom) << plain.result.error;
  EXPECT_EQ(offloaded.result.outcome, Outcome::kOk) << offloaded.result.error;
}

TEST(OffloadTest, ResumedRunReproducesTheUninterruptedLossesExactly) {
  const std::string out = testing::FreshTempDir("offload-resume");
  TrialRecord whole = RunAndRecord(DemoConfig({{"train.max_steps", "4"},
                                               {"offload", "optimizer"},
                                               {"checkpoint_every", "2"},
                                               {"output_dir", out}}));
  ASSERT_EQ(whole.result.outcome, Outcome::kOk) << whole.result.error;
  TrialRecord resumed =
      RunAndRecord(DemoConfig({{"train.max_steps", "4"}, {"offload", "optimizer"}}),
                   out + "/checkpoints/step-2");
  ASSERT_EQ(resumed.result.outcome, Outcome::kOk) << resumed.result.error;
  const std::vector<double> all = whole.Losses(), rest = resumed.Losses();
  ASSERT_EQ(rest.size(), 2u);
  for (size_t i = 0; i < rest.size(); ++i) EXPECT_EQ(rest[i], all[i + 2]) << "step " << i + 2;
  std::filesystem::remove_all(out);
}

// --- optimizer_in_backward ----------------------------------------------------------------------

// The demo run without accumulation, its parameters saved after the last step.
TrialRecord RunSaving(const std::string& out,
                      std::vector<std::pair<std::string, std::string>> overrides) {
  overrides.insert(overrides.end(), {{"train.max_steps", "3"},
                                     {"train.global_batch_size", "4"},
                                     {"checkpoint_every", "3"},
                                     {"output_dir", out}});
  return RunAndRecord(DemoConfig(overrides));
}

std::map<std::string, torch::Tensor> SavedParameters(const std::string& out) {
  auto checkpoint = LoadCheckpoint(out + "/checkpoints/step-3");
  EXPECT_TRUE(checkpoint.ok()) << checkpoint.status().ToString();
  if (!checkpoint.ok()) return {};
  // Copies: the checkpoint's tensors view its files, which go with it.
  std::map<std::string, torch::Tensor> saved;
  for (const auto& [name, tensor] : checkpoint->model) saved[name] = tensor.clone();
  return saved;
}

// A checkpoint's state file may come from another node or a path the user gave: a member of the
// wrong type or out of its range is DataLoss naming the file, never an exception or a float read
// past an integer's range.
TEST(CheckpointTest, AStateFileOfWrongTypesIsRefusedByName) {
  const std::string out = testing::FreshTempDir("bad-state");
  RunSaving(out, {});
  const std::string dir = out + "/checkpoints/step-3";
  const std::string state_path = dir + "/" + std::string(kCheckpointStateFile);
  ASSERT_TRUE(LoadCheckpoint(dir).ok());
  std::ifstream in(state_path);
  const nlohmann::json good = nlohmann::json::parse(in);
  const std::pair<std::function<void(nlohmann::json&)>, std::string> cases[] = {
      {[](nlohmann::json& j) { j["format_version"] = 1e300; },
       "unsupported checkpoint format_version 1e+300"},
      {[](nlohmann::json& j) { j["format_version"] = "1"; },
       "unsupported checkpoint format_version \"1\""},
      // One of a newer llm-train (resumed after a downgrade, or from a path the user gave).
      {[](nlohmann::json& j) { j["format_version"] = 2; },
       "checkpoint format_version 2 is newer than this llm-train reads (1): a newer llm-train "
       "wrote it; resume with that one"},
      {[](nlohmann::json& j) { j["next_step"] = 1e300; }, "next_step must be a step count"},
      {[](nlohmann::json& j) { j["next_step"] = -4; }, "next_step must be a step count"},
      {[](nlohmann::json& j) { j["loss_scale"] = "x"; },
       "loss_scale must be a finite non-negative number"},
      {[](nlohmann::json& j) { j.erase("data_position"); }, "no data_position"},
  };
  for (const auto& [edit, message] : cases) {
    nlohmann::json bad = good;
    edit(bad);
    std::ofstream(state_path, std::ios::trunc) << bad.dump();
    const Status loaded = LoadCheckpoint(dir).status();
    EXPECT_EQ(loaded.code(), StatusCode::kDataLoss) << message;
    EXPECT_EQ(loaded.message(), state_path + ": " + message);
  }
  std::filesystem::remove_all(out);
}

void ExpectSameFinalParameters(const std::vector<std::pair<std::string, std::string>>& technique) {
  const std::string normal_dir = testing::FreshTempDir("normal"),
                    in_backward_dir = testing::FreshTempDir("in-backward");
  std::vector<std::pair<std::string, std::string>> in_backward = technique;
  in_backward.emplace_back("optimizer_in_backward", "true");
  ExpectSameLosses(RunSaving(normal_dir, technique), RunSaving(in_backward_dir, in_backward), 1e-5);
  const auto normal = SavedParameters(normal_dir),
             updated_in_backward = SavedParameters(in_backward_dir);
  ASSERT_EQ(normal.size(), updated_in_backward.size());
  for (const auto& [name, tensor] : normal) {
    EXPECT_TRUE(torch::allclose(tensor, updated_in_backward.at(name), /*rtol=*/1e-4, /*atol=*/1e-6))
        << name;
  }
  std::filesystem::remove_all(normal_dir);
  std::filesystem::remove_all(in_backward_dir);
}

TEST(OptimizerInBackwardTest, FinalParametersEqualTheNormalPathsWithAdamW) {
  ExpectSameFinalParameters({});
}

TEST(OptimizerInBackwardTest, FinalParametersEqualTheNormalPathsWithSgd) {
  ExpectSameFinalParameters({{"optimizer", "sgd"}, {"train.momentum", "0.9"}, {"train.lr", "0.1"}});
}

// Activation checkpointing accumulates each layer's gradients in a nested backward and the chunked
// loss hands the tied weight's over once: every parameter is still updated exactly once per step.
TEST(OptimizerInBackwardTest, FinalParametersEqualTheNormalPathsWithCheckpointingAndChunkedLoss) {
  ExpectSameFinalParameters({{"activation_checkpointing", "true"}, {"loss", "chunked_ce"}});
}

// One example per step with activation checkpointing and the chunked loss, so that activations no
// longer hide the gradients: measured peaks 18.14 MB normal, 15.18 MB in backward, 2,953,728 bytes
// less = every gradient but the largest, the tied embedding's (2048 x 128 fp32), which both paths
// hold at the end of backward. (With the demo's 4 x 128-token micro-batches the peak comes at the
// start of backward, where the loss's gradient meets all activations and few parameter gradients
// exist: the same for both.)
TEST(OptimizerInBackwardTest, NoGradientsAfterBackwardAndALowerPeak) {
  auto run_with = [](const std::string& in_backward) {
    return RunAndRecord(DemoConfig({{"train.max_steps", "2"},
                                    {"train.micro_batch_size", "1"},
                                    {"train.global_batch_size", "1"},
                                    {"activation_checkpointing", "true"},
                                    {"loss", "chunked_ce"},
                                    {"optimizer_in_backward", in_backward}}));
  };
  TrialRecord normal = run_with("false");
  TrialRecord in_backward = run_with("true");
  ASSERT_EQ(normal.result.outcome, Outcome::kOk) << normal.result.error;
  ASSERT_EQ(in_backward.result.outcome, Outcome::kOk) << in_backward.result.error;
  const uint64_t grads = 4 * DemoParameterCount();
  EXPECT_EQ(Field(normal.Snapshot(1, 0, "phase2_after_bwd"), "grads_bytes"), grads);
  EXPECT_EQ(Field(in_backward.Snapshot(1, 0, "phase2_after_bwd"), "grads_bytes"), 0u);
  EXPECT_EQ(Field(in_backward.Snapshot(1, 0, "phase3_after_opt_step"), "optim_device_bytes"),
            2 * grads + 4);
  // The tied embedding's gradient is exempt twice: its head part, which the chunked loss forms in
  // forward, is held from the loss to the end of backward on both paths, and meets the
  // embedding's own part there. Measured: 17.16 MB against 14.54 MB, 2.62 MB lower.
  const uint64_t embedding_grad = 4 * 2048 * 128;
  EXPECT_GE(normal.result.peak_bytes, in_backward.result.peak_bytes + grads - 2 * embedding_grad);
}

}  // namespace
}  // namespace llmctl::trainer
