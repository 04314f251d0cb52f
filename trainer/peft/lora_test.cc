// LoRA against Hugging Face PEFT (fixtures made by scripts/fixtures/make_peft_fixtures.py): logits
// of base + PEFT's adapter, the files our writer produces, the merged model, and every broken
// adapter directory.
#include "trainer/peft/lora.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "common/files.h"
#include "common/model_config.h"
#include "trainer/model/loss.h"
#include "trainer/model/weights.h"
#include "common/safetensors/safetensors.h"
#include "trainer/testing/trial_runner.h"

namespace llmctl::trainer {
namespace {

using nlohmann::json;

std::string FixtureDir(const std::string& name) {
  return testing::SourceDir() + "/tests/fixtures/" + name;
}

// What make_peft_fixtures.py gave PEFT: r 4, alpha 8, every projection.
LoraConfig FixtureLora() {
  LoraConfig config;
  config.options = {.r = 4, .alpha = 8.0, .dropout = 0.05};
  config.targets = {"q_proj",    "k_proj",  "v_proj",    "o_proj",
                    "gate_proj", "up_proj", "down_proj", "lm_head"};
  return config;
}

LlamaForCausalLM TinyLlama(const std::string& dir = FixtureDir("models/tiny-llama")) {
  auto config = LoadHfConfig(dir);
  EXPECT_TRUE(config.ok()) << config.status().ToString();
  auto model = BuildModel(*config, "pretrained", dir, torch::kFloat32, torch::kCPU);
  EXPECT_TRUE(model.ok()) << model.status().ToString();
  return *model;
}

LlamaForCausalLM TinyLlamaWithFixtureAdapter() {
  LlamaForCausalLM model = TinyLlama();
  ApplyLora(model, FixtureLora());
  Status status = LoadAdapter(model, FixtureLora(), FixtureDir("peft/tiny-llama-lora"));
  EXPECT_TRUE(status.ok()) << status.ToString();
  model->eval();
  return model;
}

struct ExpectedBatch {
  std::unique_ptr<safetensors::SafetensorsFile> file;
  torch::Tensor input_ids, mask, logits;
};

ExpectedBatch LoadExpected() {
  auto file =
      safetensors::SafetensorsFile::Open(FixtureDir("peft/tiny-llama-lora/expected.safetensors"));
  EXPECT_TRUE(file.ok()) << file.status().ToString();
  ExpectedBatch batch;
  batch.input_ids = TensorFromView(*(*file)->Find("input_ids")).clone();
  batch.mask = TensorFromView(*(*file)->Find("attention_mask")).to(torch::kBool);
  batch.logits = TensorFromView(*(*file)->Find("logits"));
  batch.file = std::move(*file);
  return batch;
}

// Largest |Δlogit| over real (unpadded) tokens against PEFT's logits.
double MaxLogitDifference(LlamaForCausalLM& model, const ExpectedBatch& batch) {
  torch::NoGradGuard no_grad;
  const torch::Tensor logits =
      model->Logits(model->Hidden(batch.input_ids, LlamaOptions{}));  // (B, T, V)
  EXPECT_EQ(logits.sizes(), batch.logits.sizes());
  return (logits - batch.logits).abs().index({batch.mask}).max().item<double>();
}

json ReadJson(const std::string& path) {
  auto text = ReadFileToString(path);
  EXPECT_TRUE(text.ok()) << text.status().ToString();
  return text.ok() ? json::parse(*text) : json();
}

TEST(PeftParityTest, LogitsMatchPeftModelWithAnAdapterOnEveryProjection) {
  LlamaForCausalLM model = TinyLlamaWithFixtureAdapter();
  ExpectedBatch batch = LoadExpected();
  const double difference = MaxLogitDifference(model, batch);
  std::ostringstream figure;
  figure << std::scientific << difference;
  RecordProperty("max_abs_logit_difference", figure.str());
  EXPECT_LE(difference, 1e-4);
  // The adapter must matter for the comparison to mean anything.
  LlamaForCausalLM base = TinyLlama();
  base->eval();
  EXPECT_GT(MaxLogitDifference(base, batch), 1e-2);
}

TEST(PeftParityTest, LogitsTakeAnyLeadingShape) {
  LlamaForCausalLM model = TinyLlamaWithFixtureAdapter();
  torch::NoGradGuard no_grad;
  const torch::Tensor hidden =
      model->Hidden(LoadExpected().input_ids, LlamaOptions{});                      // (B, T, C)
  const torch::Tensor rows = model->Logits(hidden.reshape({-1, hidden.size(-1)}));  // (B*T, V)
  EXPECT_TRUE(torch::equal(rows, model->Logits(hidden).reshape({-1, rows.size(-1)})));
}

TEST(PeftFilesTest, SavedAdapterHasPeftsTensorsAndConfig) {
  LlamaForCausalLM model = TinyLlamaWithFixtureAdapter();
  const std::string out = testing::FreshTempDir("adapter");
  Status status = SaveAdapter(model, FixtureLora(), "tests/fixtures/models/tiny-llama", out);
  ASSERT_TRUE(status.ok()) << status.ToString();

  const std::string fixture = FixtureDir("peft/tiny-llama-lora");
  auto ours = safetensors::SafetensorsFile::Open(out + "/adapter_model.safetensors");
  auto peft = safetensors::SafetensorsFile::Open(fixture + "/adapter_model.safetensors");
  ASSERT_TRUE(ours.ok()) << ours.status().ToString();
  ASSERT_TRUE(peft.ok()) << peft.status().ToString();
  ASSERT_EQ((*ours)->tensors().size(), (*peft)->tensors().size());
  for (const safetensors::TensorView& want : (*peft)->tensors()) {
    const safetensors::TensorView* got = (*ours)->Find(want.name);
    ASSERT_NE(got, nullptr) << want.name;
    EXPECT_EQ(got->shape, want.shape) << want.name;
    EXPECT_EQ(got->dtype, want.dtype) << want.name;
    EXPECT_TRUE(torch::equal(TensorFromView(*got), TensorFromView(want))) << want.name;
  }
  EXPECT_EQ((*ours)->metadata(), (*peft)->metadata());

  // Every field we write has PEFT's value (target_modules is a set in PEFT: its order is
  // arbitrary).
  json our_config = ReadJson(out + "/adapter_config.json");
  json peft_config = ReadJson(fixture + "/adapter_config.json");
  for (json* config : {&our_config, &peft_config}) {
    auto& targets = (*config)["target_modules"];
    std::sort(targets.begin(), targets.end());
  }
  for (const auto& [field, value] : our_config.items()) {
    ASSERT_TRUE(peft_config.contains(field)) << field;
    EXPECT_EQ(value, peft_config[field]) << field;
  }
  for (const char* field : {"peft_type", "task_type", "r", "lora_alpha", "lora_dropout",
                            "target_modules", "bias", "fan_in_fan_out", "inference_mode",
                            "use_rslora", "init_lora_weights", "base_model_name_or_path"}) {
    EXPECT_TRUE(our_config.contains(field)) << field;
  }

  // And it loads back into the same logits.
  LlamaForCausalLM reloaded = TinyLlama();
  ApplyLora(reloaded, FixtureLora());
  status = LoadAdapter(reloaded, FixtureLora(), out);
  ASSERT_TRUE(status.ok()) << status.ToString();
  reloaded->eval();
  EXPECT_LE(MaxLogitDifference(reloaded, LoadExpected()), 1e-4);
  std::filesystem::remove_all(out);
}

TEST(PeftFilesTest, MergedModelLoadsAsAPlainModelWithTheAdaptersLogits) {
  LlamaForCausalLM model = TinyLlamaWithFixtureAdapter();
  const std::string out = testing::FreshTempDir("merged");
  Status status = SaveMerged(model, out);
  ASSERT_TRUE(status.ok()) << status.ToString();
  // tiny-llama ties its embeddings; the lm_head adapter unties them.
  EXPECT_EQ(ReadJson(out + "/config.json")["tie_word_embeddings"], false);
  LlamaForCausalLM merged = TinyLlama(out);
  merged->eval();
  for (const auto& item : merged->named_parameters())
    EXPECT_FALSE(IsAdapterParameter(item.key())) << item.key();
  EXPECT_LE(MaxLogitDifference(merged, LoadExpected()), 1e-4);
  std::filesystem::remove_all(out);
}

TEST(ApplyLoraTest, FreezesTheBaseAndStartsAsTheIdentity) {
  const ModelConfig* demo = FindPreset("llmctl-demo");
  ASSERT_NE(demo, nullptr);
  torch::manual_seed(3);
  LlamaForCausalLM model(*demo);
  model->InitializeRandom();
  torch::manual_seed(4);
  const torch::Tensor ids = torch::randint(0, demo->vocab_size, {2, 16}, torch::kInt64);
  torch::Tensor before;
  {
    torch::NoGradGuard no_grad;
    before = model->Logits(model->Hidden(ids, LlamaOptions{}));
  }
  LoraConfig config;
  config.options = {.r = 8, .alpha = 16.0, .dropout = 0.0};
  config.targets = {"q_proj", "v_proj", "lm_head"};
  ApplyLora(model, config);

  std::set<std::string> trainable;
  for (const auto& item : model->named_parameters()) {
    EXPECT_EQ(item.value().requires_grad(), IsAdapterParameter(item.key())) << item.key();
    if (item.value().requires_grad()) trainable.insert(item.key());
  }
  EXPECT_EQ(trainable.size(), 2u * (2u * static_cast<size_t>(demo->num_hidden_layers) + 1u));
  EXPECT_TRUE(trainable.contains("model.layers.0.self_attn.q_proj.lora_A.weight"));
  EXPECT_TRUE(trainable.contains("model.layers.3.self_attn.v_proj.lora_B.weight"));
  EXPECT_TRUE(
      trainable.contains("lm_head.lora_A.weight"));  // tied embeddings: PEFT's name all the same
  EXPECT_FALSE(trainable.contains("model.layers.0.self_attn.k_proj.lora_A.weight"));

  // B starts at zero: the adapted model computes what the base did.
  torch::NoGradGuard no_grad;
  EXPECT_TRUE(torch::equal(model->Logits(model->Hidden(ids, LlamaOptions{})), before));
}

TEST(ApplyLoraTest, SameSeedSameAdapters) {
  auto adapters = [] {
    torch::manual_seed(5);
    LlamaForCausalLM model = TinyLlama();
    ApplyLora(model, FixtureLora());
    std::vector<torch::Tensor> values;
    for (const auto& item : model->named_parameters()) {
      if (IsAdapterParameter(item.key())) values.push_back(item.value().clone());
    }
    return values;
  };
  const auto a = adapters(), b = adapters();
  ASSERT_EQ(a.size(), 30u);  // 2 layers x 7 projections + lm_head, A and B each
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(torch::equal(a[i], b[i])) << i;
}

// The adapters' gradients with activation checkpointing and/or the chunked loss (which must reach
// the lm_head adapter through OutputParameters()).
std::vector<torch::Tensor> AdapterGradients(bool checkpointing, bool chunked_loss) {
  LlamaForCausalLM model = TinyLlamaWithFixtureAdapter();
  const torch::Tensor ids = LoadExpected().input_ids;
  LlamaOptions options;
  options.activation_checkpointing = checkpointing;
  const torch::Tensor hidden = model->Hidden(ids, options);  // (B, T, C)
  if (chunked_loss) {
    ChunkedCausalLmLoss(
        hidden, ids, [model](const torch::Tensor& h) mutable { return model->Logits(h); },
        model->OutputParameters(), /*chunk_tokens=*/7)
        .backward();
  } else {
    CausalLmLoss(model->Logits(hidden), ids).backward();
  }
  std::vector<torch::Tensor> grads;
  for (const auto& item : model->named_parameters()) {
    if (!IsAdapterParameter(item.key())) {
      EXPECT_FALSE(item.value().grad().defined()) << item.key();
      continue;
    }
    EXPECT_TRUE(item.value().grad().defined()) << item.key();
    if (item.value().grad().defined()) grads.push_back(item.value().grad().clone());
  }
  return grads;
}

TEST(ApplyLoraTest, ActivationCheckpointingGivesTheAdaptersTheSameGradients) {
  const auto plain = AdapterGradients(false, false);
  const auto checkpointed = AdapterGradients(true, false);
  ASSERT_EQ(plain.size(), 30u);
  ASSERT_EQ(checkpointed.size(), plain.size());
  for (size_t i = 0; i < plain.size(); ++i) {
    EXPECT_TRUE(torch::allclose(plain[i], checkpointed[i], 1e-5, 1e-6)) << "adapter tensor " << i;
  }
}

TEST(ApplyLoraTest, ChunkedLossGivesTheAdaptersTheSameGradients) {
  const auto plain = AdapterGradients(false, false);
  const auto chunked = AdapterGradients(false, true);
  ASSERT_EQ(plain.size(), 30u);
  ASSERT_EQ(chunked.size(), plain.size());
  for (size_t i = 0; i < plain.size(); ++i) {
    EXPECT_TRUE(torch::allclose(plain[i], chunked[i], 1e-5, 1e-6)) << "adapter tensor " << i;
  }
}

// tests/fixtures/peft/broken/<case>/: an adapter for tiny-llama (r 2, alpha 4 on q_proj and v_proj)
// broken in one way; expected.txt holds part of the message.
TEST(BrokenAdapterTest, EveryCaseIsOneClearErrorNamingTheFile) {
  const std::filesystem::path root = FixtureDir("peft/broken");
  LoraConfig config;
  config.options = {.r = 2, .alpha = 4.0, .dropout = 0.0};
  config.targets = {"q_proj", "v_proj"};
  int cases = 0;
  for (const auto& entry : std::filesystem::directory_iterator(root)) {
    const std::string dir = entry.path().string();
    std::ifstream in(entry.path() / "expected.txt");
    std::string expected;
    std::getline(in, expected);
    ASSERT_FALSE(expected.empty()) << dir;
    LlamaForCausalLM model = TinyLlama();
    ApplyLora(model, config);
    const Status status = LoadAdapter(model, config, dir);
    ASSERT_FALSE(status.ok()) << dir;
    EXPECT_NE(status.message().find(dir + "/adapter_"), std::string::npos) << status.message();
    EXPECT_NE(status.message().find(expected), std::string::npos)
        << entry.path().filename() << ": " << status.message();
    ++cases;
  }
  EXPECT_EQ(cases, 17);
}

}  // namespace
}  // namespace llmctl::trainer
