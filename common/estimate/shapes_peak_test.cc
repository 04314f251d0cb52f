// The predicted peak on published model shapes (issue 28): SmolLM, Qwen2, TinyLlama and Llama 3,
// with their GQA, tied and untied embeddings, vocabularies up to 151,936, Qwen2's q/k/v biases and
// Llama 3.2's llama3 rope. tests/fixtures/model-shapes holds each one's config.json with two layers
// in place of its 16 to 32, so a step fits this CPU; the vocabulary and every layer's shape are the
// published ones, and at two layers the embeddings weigh most, as in issue 28's misses. llm-train
// runs each shape and technique for two steps on full-length examples as peak_test.cc runs its
// sweep; its model state must equal the estimate's byte for byte, and its measured peak must lie
// within [-2%, +3%] of the estimate's: an estimate under the real peak is the costly error (a trial
// admitted that then runs out of memory), so the bound below is the tighter one.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <ostream>
#include <string>
#include <vector>

#include "common/estimate/trainer_runs.h"

namespace llmctl::estimate {
namespace {

namespace fs = std::filesystem;
using testing::Case;
using testing::Sets;
using testing::With;

// testing::PeakRunSets at a micro-batch of 64 tokens unless a technique sets more: the short step
// keeps the sweep to minutes on two cores.
Sets CommonSets(const fs::path& dir) {
  return With(testing::PeakRunSets(dir), {{"data.max_seq_length", "64"},
                                          {"train.micro_batch_size", "1"},
                                          {"train.global_batch_size", "1"}});
}

struct Technique {
  std::string name;
  Sets sets;  // over demo.yaml's: 32-true AdamW, kernels fused (with the chunked loss)
};

struct Shape {
  std::string name;  // tests/fixtures/model-shapes/<name>
  std::vector<Technique> techniques;
};

// gtest's name for the parameter in test listings (ctest's discovery reads them).
void PrintTo(const Shape& shape, std::ostream* os) { *os << shape.name; }

// Each shape with the techniques its memory allows here (two run at once under ctest -j2, each
// under about 5 GB): fp32 AdamW up to TinyLlama's 220M parameters at two layers (3.5 GB), bf16 or
// SGD on Qwen2-1.5B's 330M and Llama 3.2 1B's 380M (whose fp32 AdamW peaks at 7.2 GB), and only
// LoRA and QLoRA on Llama 3 8B's 1.5B (two embeddings of 525M).
std::vector<Shape> Shapes() {
  const Sets aten = {{"kernels", "aten"}};
  const Sets bf16 = {{"precision", "bf16-true"}};
  const Sets accumulate = {{"train.micro_batch_size", "2"}, {"train.global_batch_size", "4"}};
  // Four times the tokens, where the logits and the saved activations weigh against the weights.
  const Sets longer = {{"data.max_seq_length", "256"},
                       {"train.micro_batch_size", "2"},
                       {"train.global_batch_size", "2"}};
  return {
      {"smollm-135m",
       {{"32-true adamw, aten", aten},
        {"32-true adamw, fused", {}},
        {"bf16-mixed", {{"precision", "bf16-mixed"}}},
        {"activation checkpointing", {{"activation_checkpointing", "true"}}},
        {"accumulation 2 x 2", accumulate},
        {"2 x 256 tokens, aten", With(longer, aten)}}},
      {"smollm-360m",
       {{"bf16-true adamw", bf16},
        {"sgd, momentum 0.9", {{"optimizer", "sgd"}, {"train.momentum", "0.9"}}},
        {"adamw_8bit", {{"optimizer", "adamw_8bit"}}},
        {"chunked loss, aten", With(aten, {{"loss", "chunked_ce"}})},
        {"lora", {{"peft.method", "lora"}}}}},
      {"qwen2-0.5b",
       {{"32-true adamw, aten", aten},
        {"bf16-true adamw", bf16},
        {"bf16-true lora", With(bf16, {{"peft.method", "lora"}})},
        {"qlora", {{"peft.method", "qlora"}}},
        {"activation checkpointing, aten", With(aten, {{"activation_checkpointing", "true"}})},
        {"accumulation 2 x 2", accumulate},
        {"bf16-true, aten, 2 x 256 tokens", With(With(bf16, aten), longer)},
        {"bf16-true lora, 2 x 256 tokens", With(With(bf16, {{"peft.method", "lora"}}), longer)}}},
      {"qwen2-1.5b",
       {{"bf16-true adamw", bf16},
        {"sgd", {{"optimizer", "sgd"}}},
        {"qlora", {{"peft.method", "qlora"}}}}},
      {"tinyllama-1.1b",
       {{"32-true adamw, aten", aten},
        {"bf16-true adamw_8bit", With(bf16, {{"optimizer", "adamw_8bit"}})},
        {"lora", {{"peft.method", "lora"}}}}},
      {"llama-3.2-1b",
       {{"bf16-true adamw", bf16},
        {"sgd", {{"optimizer", "sgd"}}},
        {"lora, aten", With(aten, {{"peft.method", "lora"}})},
        {"qlora", {{"peft.method", "qlora"}}}}},
      {"llama-3-8b",
       {{"bf16-true lora", With(bf16, {{"peft.method", "lora"}})},
        {"qlora", {{"peft.method", "qlora"}}}}},
  };
}

// One test per shape, so that ctest spreads the shapes over its jobs. Measured (11-28): -0.08% to
// +0.17% (Llama 3 8B's QLoRA was -1.24% until QLoRA's dequantised weight was traced).
class ShapePeakTest : public ::testing::TestWithParam<Shape> {};

TEST_P(ShapePeakTest, WithinThreePercentNeverTwoUnder) {
  const Shape& shape = GetParam();
  const fs::path dir = testing::TestDir();
  const std::string model = testing::SourceDir() + "/tests/fixtures/model-shapes/" + shape.name;
  std::vector<Case> cases;
  std::vector<std::string> labels;
  for (const Technique& technique : shape.techniques) {
    cases.push_back({"demo.yaml", "", With({{"model", model}}, technique.sets)});
    labels.push_back(shape.name + " " + technique.name);
  }
  testing::ExpectPeaksWithin(cases, CommonSets(dir), dir, {}, labels);
  fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(EstimatePeakTest, ShapePeakTest, ::testing::ValuesIn(Shapes()),
                         [](const ::testing::TestParamInfo<Shape>& info) {
                           std::string name = info.param.name;
                           std::replace_if(
                               name.begin(), name.end(),
                               [](char c) { return c == '-' || c == '.'; }, '_');
                           return name;
                         });

}  // namespace
}  // namespace llmctl::estimate
