// BLIP-2's model state against the real trainer: llm-train runs each configuration for one step of
// one micro-batch on the stand-ins of experiments/cpu-lab-blip2.yaml (OPT-256 x 8, OPT-384 x 12,
// Flan-T5 768 x 2 + 2, each behind the same ViT and Q-Former), and its snapshot after the optimizer
// step must equal EstimateBlip2ModelState byte for byte in every category, its start event's
// parameter counts too. The file's rows are checked on their own runs (blip2_peak_test.cc,
// CpuLabBlip2RowTest), and so are the configurations whose peak EstimateBlip2PeakTest runs.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "common/estimate/blip2_trainer_runs.h"
#include "common/estimate/trainer_runs.h"

namespace llmctl::estimate {
namespace {

namespace fs = std::filesystem;
using testing::Case;
using testing::Sets;
using testing::With;

// The file's other stand-ins, as its rows set them (paths from the source tree: a --set path is
// not resolved beside the file).
std::string Experiments() { return testing::SourceDir() + "/experiments/"; }
const Sets kT5 = {{"model", Experiments() + "models/cpu-lab-blip2-t5"},
                  {"tokenizer", Experiments() + "tokenizers/captions-t5"},
                  {"data.max_seq_length", "12"}};
const Sets kMedium = {{"model", Experiments() + "models/cpu-lab-blip2-medium"}};

// Each case as testing::ExpectBlip2StatesExact runs it: one step of one micro-batch.
void ExpectBlip2Exact(const std::vector<Case>& cases) {
  const fs::path dir = testing::TestDir();
  // The captions' token cache, the test's own.
  setenv("LLMCTL_CACHE_DIR", (dir / "cache").c_str(), 1);
  testing::ExpectBlip2StatesExact(cases, dir, /*first_index=*/0, /*images=*/0);
  if (::testing::Test::HasFatalFailure()) return;
  fs::remove_all(dir);
}

// The techniques on one device, over the three stand-ins: precisions, optimizers, freezing parts,
// LoRA and QLoRA on OPT's and T5's projections (T5's dense wo included), at one image a micro-batch
// (where the class embedding's gradient keeps a whole (1, P, C) storage) and two. Four more are
// EstimateBlip2PeakTest.TechniquesOnOneDevice's, whose runs check their model state: one image
// of plain fp32 AdamW, and at four
// images, the same tensors as at two, SGD with momentum, LoRA on T5's q, v, wo and head, and the
// optimizer offloaded under bf16-true.
TEST(EstimateBlip2ExactTest, TechniquesOnOneDevice) {
  const Sets one = {{"train.micro_batch_size", "1"}, {"train.global_batch_size", "1"}};
  const Sets two = {{"train.micro_batch_size", "2"}, {"train.global_batch_size", "4"}};
  std::vector<Case> cases;
  for (const Sets& sets : std::vector<Sets>{
           With(two, {{"precision", "bf16-true"}}),
           With(one, {{"precision", "bf16-mixed"}}),
           With(one, {{"optimizer", "adamw_8bit"}}),
           With(one, {{"freeze", "[vision_model, qformer]"}}),
           With(two, {{"freeze", "[language_model]"}, {"optimizer", "adamw_8bit"}}),
           With(one, {{"peft.method", "lora"}, {"peft.targets", "[q_proj, v_proj, fc1]"}}),
           With(two, {{"peft.method", "qlora"},
                      {"peft.double_quant", "false"},
                      {"peft.compute_dtype", "fp32"},
                      {"peft.targets", "[out_proj, fc2]"}}),
           With(With(one, kMedium), {{"peft.method", "qlora"}}),
           With(With(two, kMedium), {{"precision", "bf16-true"}, {"optimizer", "adamw_8bit"}}),
           With(With(one, kT5), {{"precision", "bf16-true"}, {"optimizer", "adamw_8bit"}}),
           With(With(one, kT5), {{"peft.method", "qlora"}, {"peft.targets", "[q, wi_0, wo]"}}),
           With(With(one, kT5), {{"optimizer", "sgd"},
                                 {"optimizer_in_backward", "true"},
                                 {"precision", "bf16-true"}}),
       }) {
    cases.push_back({"cpu-lab-blip2.yaml", "reduced-batch", sets});
  }
  ExpectBlip2Exact(cases);
}

// Two ranks: ddp's buckets; fsdp's shards of every block of every stack (T5's relative-position
// biases in the root unit), with 8-bit AdamW's aligned flats, LoRA's frozen flats and QLoRA's NF4
// buffers.
TEST(EstimateBlip2ExactTest, DataParallelRanks) {
  const Sets two = {
      {"devices", "2"}, {"train.micro_batch_size", "1"}, {"train.global_batch_size", "2"}};
  std::vector<Case> cases;
  for (const Sets& sets : std::vector<Sets>{
           {{"strategy", "ddp"}},
           With(kT5, {{"strategy", "ddp"}, {"peft.method", "qlora"}, {"peft.targets", "[q, v]"}}),
           {{"strategy", "fsdp"}},
           {{"strategy", "fsdp"}, {"optimizer", "adamw_8bit"}},
           {{"strategy", "fsdp"}, {"peft.method", "lora"}},
           With(kT5,
                {{"strategy", "fsdp"}, {"precision", "bf16-true"}, {"optimizer", "adamw_8bit"}}),
           With(kT5, {{"strategy", "fsdp"}, {"peft.method", "qlora"}, {"peft.targets", "[q, v]"}}),
       }) {
    cases.push_back({"cpu-lab-blip2.yaml", "reduced-batch", With(two, sets), 2});
  }
  ExpectBlip2Exact(cases);
}

}  // namespace
}  // namespace llmctl::estimate
