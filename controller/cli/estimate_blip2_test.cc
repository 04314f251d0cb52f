// `llmctl estimate` on BLIP-2 experiment files: the rows of the labs' BLIP-2 tables, estimated as
// common/estimate/blip2_memory.h does (its peaks are checked against llm-train's in
// estimate_blip2_peak_test), with the verdicts the rows expect.
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "common/blip2_config.h"
#include "common/experiment.h"
#include "common/files.h"
#include "common/inputs/drawn_batches.h"
#include "controller/cli/estimate.h"
#include "tests/support/shell_command.h"

namespace llmctl::cli {
namespace {

using nlohmann::json;

std::string Experiments() { return (llmctl::testing::SourceDir() / "experiments/").string(); }

json EstimateJson(const std::string& file, EstimateOptions options = {}) {
  options.format = "json";
  StatusOr<std::string> text = EstimateExperiment(file, options);
  EXPECT_TRUE(text.ok()) << text.status().message();
  return text.ok() ? json::parse(*text) : json();
}

// Every row of the CPU lab's BLIP-2 table is estimated from the file's own captions (their
// longest, read with the row's tokenizer) and judged against its 280 MiB device as the row
// expects: the three out-of-memory rows and no other.
TEST(EstimateBlip2Test, CpuLabRowsAreEstimatedWithTheVerdictsTheyExpect) {
  const std::string file = Experiments() + "cpu-lab-blip2.yaml";
  StatusOr<Experiment> experiment = LoadExperimentFile(file);
  ASSERT_TRUE(experiment.ok()) << experiment.status().message();
  std::map<std::string, std::string> expected;
  for (const Trial& trial : experiment->trials) expected[trial.name] = trial.expect.value_or("");
  const json out = EstimateJson(file);
  ASSERT_EQ(out["trials"].size(), expected.size());
  for (const json& trial : out["trials"]) {
    SCOPED_TRACE(trial.dump());
    ASSERT_TRUE(trial["estimated"].get<bool>());
    EXPECT_EQ(trial["verdict"], expected[trial["name"]] == "oom" ? "oom" : "fits");
    EXPECT_NE(trial["note"].get<std::string>().find("longest of"), std::string::npos);
  }
}

// The time is the report's: at the mean micro-batch the run draws after its first step, its tokens
// the rows' real ones (queries and caption: what llm-train's steps count, DrawnBatchesTest), where
// the peak is at the longest caption of the set.
TEST(EstimateBlip2Test, TheTimeIsAtTheMeanDrawnMicroBatchAndItsRealTokens) {
  const std::string file = Experiments() + "cpu-lab-blip2.yaml";
  StatusOr<Experiment> experiment = LoadExperimentFile(file);
  ASSERT_TRUE(experiment.ok()) << experiment.status().message();
  const Trial& trial = experiment->trials[1];
  ASSERT_EQ(trial.expect.value_or(""), "ok");
  StatusOr<std::optional<Blip2Config>> model =
      ResolveBlip2Model(trial.config.settings().model.name);
  ASSERT_TRUE(model.ok() && model->has_value());
  StatusOr<DrawnBatches> drawn = DrawCaptionBatches(trial.config, **model);
  ASSERT_TRUE(drawn.ok()) << drawn.status().message();

  EstimateOptions options;
  options.trial = trial.name;
  const json estimated = EstimateJson(file, options)["trials"][0];
  SCOPED_TRACE(estimated.dump());
  const json& work = estimated["time"]["work"];
  const int64_t micro = trial.config.settings().train.micro_batch_size;
  EXPECT_EQ(work["tokens"].get<int64_t>(),
            static_cast<int64_t>(drawn->mean_real_tokens) * work["micro_batches"].get<int64_t>());
  // Fewer than the peak's rows at the longest caption: padding is not a token, and most micro-
  // batches are shorter than the longest.
  EXPECT_LT(work["tokens"].get<int64_t>(),
            estimated["tokens"].get<int64_t>() * work["micro_batches"].get<int64_t>());
  EXPECT_EQ(estimated["tokens"].get<int64_t>() % micro, 0);
  EXPECT_NE(estimated["note"].get<std::string>().find("the time at the mean micro-batch"),
            std::string::npos);
  // Its figures name which length is the peak's, as a LLaMA trial's do.
  EXPECT_NE(
      estimated["note"].get<std::string>().find(
          ": peak at " +
          std::to_string(estimated["tokens"].get<int64_t>() / micro - (*model)->num_query_tokens) +
          " tokens, time at "),
      std::string::npos)
      << estimated["note"];
  // Each example's image, a 256 x 256 PNG, decoded on the host.
  EXPECT_EQ(work["jpeg_pixels"].get<double>(), 0);
  EXPECT_EQ(work["png_pixels"].get<double>(),
            static_cast<double>(micro * work["micro_batches"].get<int64_t>()) * 256 * 256);
}

// The lab's own file names the hub's models: a BLIP-2 preset's name is estimated from the preset's
// shapes (the hub's config.json), its captions at data.max_seq_length since its tokenizer is not
// here, against the target's H100; a hub model that is no preset is not estimated.
TEST(EstimateBlip2Test, HubPresetsAreEstimatedFromTheirShapes) {
  EstimateOptions one;
  one.trial = "reduced-batch";
  const json out = EstimateJson(Experiments() + "single.yaml", one);
  ASSERT_EQ(out["trials"].size(), 1u);
  const json& trial = out["trials"][0];
  ASSERT_TRUE(trial["estimated"].get<bool>()) << trial.dump();
  // transformers 5's count of blip2-opt-2.7b, fp32 AdamW: 4 + 4 + 8 B a parameter.
  EXPECT_EQ(trial["parameters_total"], 3744761856);
  EXPECT_EQ(trial["params_bytes"], uint64_t{3744761856} * 4);
  EXPECT_EQ(trial["optim_device_bytes"], uint64_t{3744761856} * 8 + 4);
  EXPECT_EQ(trial["tokens"], 16 * (32 + 50));  // 16 images x (32 queries + 50 caption tokens)
  EXPECT_EQ(trial["device_source"], "target flavor g1.h100.pci.1: NVIDIA H100 NVL (94 GB)");
  EXPECT_EQ(trial["verdict"], "fits");

  const std::string file = ::testing::TempDir() + "blip2-hub.yaml";
  std::ofstream(file) << "name: hub\n"
                         "model: hf:someone/blip2-custom\n"
                         "init: pretrained\n"
                         "data: {path: "
                      << Experiments() << "data/captions, format: imagefolder}\n"
                      << "device: cuda\n"
                         "trials: [{name: one}]\n";
  EstimateOptions h100;
  h100.device_memory = "h100-94gb";
  const json other = EstimateJson(file, h100);
  ASSERT_EQ(other["trials"].size(), 1u);
  EXPECT_FALSE(other["trials"][0]["estimated"].get<bool>());
  EXPECT_NE(other["trials"][0]["reason"].get<std::string>().find("BLIP-2 presets"),
            std::string::npos);
}

// `submit` stores BLIP-2 predictions too.
TEST(EstimateBlip2Test, PredictionsIncludeBlip2Trials) {
  const std::string file = Experiments() + "cpu-lab-blip2.yaml";
  StatusOr<std::string> text = ReadFileToString(file, kMaxExperimentFileBytes);
  ASSERT_TRUE(text.ok());
  StatusOr<Experiment> experiment = ParseExperiment(*text, file, {.resolve_local_paths = true});
  ASSERT_TRUE(experiment.ok()) << experiment.status().message();
  StatusOr<std::vector<TrialPrediction>> predictions = PredictTrials(*experiment, file);
  ASSERT_TRUE(predictions.ok()) << predictions.status().message();
  ASSERT_EQ(predictions->size(), experiment->trials.size());
  for (const TrialPrediction& p : *predictions) {
    EXPECT_GT(p.peak_bytes, p.model_state_bytes) << p.trial;
    EXPECT_EQ(p.device_source, "device_memory 280MiB") << p.trial;
  }
}

}  // namespace
}  // namespace llmctl::cli
