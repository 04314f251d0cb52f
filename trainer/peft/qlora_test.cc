// QLoRA: NF4 base weights under LoRA adapters. Against PEFT over bitsandbytes' Linear4bit (fixture
// made by scripts/fixtures/make_qlora_fixtures.py): the stored NF4 weights and the logits; against
// a dense model of the dequantised weights; the bytes an NF4 projection holds; the loading peak.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <iostream>
#include <sstream>

#include "common/model_config.h"
#include "trainer/memory/accounting.h"
#include "trainer/model/weights.h"
#include "trainer/peft/lora.h"
#include "common/safetensors/safetensors.h"
#include "trainer/testing/trial_runner.h"

namespace llmctl::trainer {
namespace {

std::string FixtureDir(const std::string& name) {
  return testing::SourceDir() + "/tests/fixtures/" + name;
}

// What make_qlora_fixtures.py gave PEFT: r 4, alpha 8, on these targets; every decoder projection
// NF4 with double quantisation.
LoraConfig FixtureQlora(torch::ScalarType compute_dtype) {
  LoraConfig config;
  config.options = {.r = 4, .alpha = 8.0, .dropout = 0.0};
  config.targets = {"q_proj", "v_proj", "gate_proj", "lm_head"};
  config.nf4 = Nf4Options{.double_quant = true, .compute_dtype = compute_dtype};
  return config;
}

LlamaForCausalLM TinyLlama(const std::string& dir, const std::optional<Nf4Options>& nf4) {
  auto config = LoadHfConfig(dir);
  EXPECT_TRUE(config.ok()) << config.status().ToString();
  auto model = BuildModel(*config, "pretrained", dir, torch::kFloat32, torch::kCPU, nf4);
  EXPECT_TRUE(model.ok()) << model.status().ToString();
  return *model;
}

LlamaForCausalLM TinyQloraWithFixtureAdapter(torch::ScalarType compute_dtype) {
  const LoraConfig config = FixtureQlora(compute_dtype);
  LlamaForCausalLM model = TinyLlama(FixtureDir("models/tiny-llama"), config.nf4);
  ApplyLora(model, config);
  Status status = LoadAdapter(model, config, FixtureDir("peft/tiny-llama-qlora"));
  EXPECT_TRUE(status.ok()) << status.ToString();
  model->eval();
  return model;
}

std::unique_ptr<safetensors::SafetensorsFile> OpenExpected() {
  auto file =
      safetensors::SafetensorsFile::Open(FixtureDir("peft/tiny-llama-qlora/expected.safetensors"));
  EXPECT_TRUE(file.ok()) << file.status().ToString();
  return std::move(*file);
}

torch::Tensor Expected(const safetensors::SafetensorsFile& file, const std::string& name) {
  const safetensors::TensorView* view = file.Find(name);
  EXPECT_NE(view, nullptr) << name;
  return view == nullptr ? torch::Tensor() : TensorFromView(*view);
}

torch::Tensor LogitsOf(LlamaForCausalLM& model, const torch::Tensor& input_ids) {
  torch::NoGradGuard no_grad;
  return model->Logits(model->Hidden(input_ids, LlamaOptions{}));  // (B, T, V)
}

// Largest |Δlogit| over real (unpadded) tokens against PEFT's logits `name`.
double MaxLogitDifference(LlamaForCausalLM& model, const std::string& name) {
  auto file = OpenExpected();
  const torch::Tensor input_ids = Expected(*file, "input_ids").clone();
  const torch::Tensor mask = Expected(*file, "attention_mask").to(torch::kBool);
  const torch::Tensor expected = Expected(*file, name);
  const torch::Tensor logits = LogitsOf(model, input_ids);
  EXPECT_EQ(logits.sizes(), expected.sizes());
  return (logits - expected).abs().index({mask}).max().item<double>();
}

std::string Scientific(double value) {
  std::ostringstream text;
  text << std::scientific << value;
  return text.str();
}

TEST(QloraPeftParityTest, BaseQuantisesToBitsandbytesStoredWeights) {
  LlamaForCausalLM model =
      TinyLlama(FixtureDir("models/tiny-llama"), FixtureQlora(torch::kFloat32).nf4);
  auto file = OpenExpected();
  int quantized = 0;
  for (auto& [name, projection] : model->NamedProjections()) {
    if (name == "lm_head") {
      EXPECT_FALSE(projection->is_quantized());  // lm_head stays dense, as in bitsandbytes
      continue;
    }
    ASSERT_TRUE(projection->is_quantized()) << name;
    ++quantized;
    const Nf4Weight& w = projection->nf4_weight();
    EXPECT_TRUE(torch::equal(w.packed, Expected(*file, name + ".packed"))) << name;
    EXPECT_TRUE(torch::equal(w.quantized_absmax, Expected(*file, name + ".quantized_absmax")))
        << name;
    EXPECT_TRUE(torch::equal(w.nested_absmax, Expected(*file, name + ".nested_absmax"))) << name;
    EXPECT_TRUE(torch::equal(w.offset, Expected(*file, name + ".offset"))) << name;
  }
  EXPECT_EQ(quantized, 2 * 7);
  // Every decoder weight is an NF4 buffer, not a parameter: nothing dense is left behind.
  for (const auto& item : model->named_parameters()) {
    EXPECT_FALSE(item.key().ends_with("_proj.weight")) << item.key();
  }
}

// The same dequantise-then-matmul in fp32 on both sides: only summation order differs.
TEST(QloraPeftParityTest, LogitsMatchPeftOverLinear4bitInFp32) {
  LlamaForCausalLM model = TinyQloraWithFixtureAdapter(torch::kFloat32);
  const double difference = MaxLogitDifference(model, "logits.fp32");
  RecordProperty("max_abs_logit_difference", Scientific(difference));
  std::cout << "qlora vs PEFT+bitsandbytes, compute fp32: max |dlogit| " << difference << std::endl;
  EXPECT_LE(difference, 1e-4);
  // The adapter and the quantisation must both matter for the comparison to mean anything.
  LlamaForCausalLM base =
      TinyLlama(FixtureDir("models/tiny-llama"), FixtureQlora(torch::kFloat32).nf4);
  base->eval();
  EXPECT_GT(MaxLogitDifference(base, "logits.fp32"), 1e-2);
  LlamaForCausalLM dense = TinyLlama(FixtureDir("models/tiny-llama"), std::nullopt);
  const LoraConfig lora = FixtureQlora(torch::kFloat32);
  ApplyLora(dense, lora);
  ASSERT_TRUE(LoadAdapter(dense, lora, FixtureDir("peft/tiny-llama-qlora")).ok());
  dense->eval();
  EXPECT_GT(MaxLogitDifference(dense, "logits.fp32"), 1e-3);
}

// bf16 matmuls: the same bf16 operands on both sides (0 difference measured with LibTorch's CPU
// kernels on the fixture's machine), but another CPU's kernels (AVX2, AVX-512, AMX, oneDNN) may
// accumulate in another order and round each projection's output to bf16 on the other side of a
// tie: one bf16 ulp (2^-7 of the value's power of two) per rounding that reaches the logit. Two
// layers of attention and MLP outputs, then the head: four ulps of the largest logit bound it.
TEST(QloraPeftParityTest, LogitsMatchPeftOverLinear4bitInBf16) {
  LlamaForCausalLM model = TinyQloraWithFixtureAdapter(torch::kBFloat16);
  const double difference = MaxLogitDifference(model, "logits.bf16");
  auto file = OpenExpected();
  const double largest = Expected(*file, "logits.bf16").abs().max().item<double>();
  const double bf16_ulp = std::ldexp(1.0, std::ilogb(largest) - 7);
  RecordProperty("max_abs_logit_difference", Scientific(difference));
  std::cout << "qlora vs PEFT+bitsandbytes, compute bf16: max |dlogit| " << difference << " (bound "
            << 4 * bf16_ulp << ": 4 bf16 ulps of the largest logit " << largest << ")" << std::endl;
  EXPECT_LE(difference, 4 * bf16_ulp);
}

TEST(QloraFilesTest, MergedModelIsDenseWithTheQloraModelsLogits) {
  LlamaForCausalLM model = TinyQloraWithFixtureAdapter(torch::kFloat32);
  const std::string out = testing::FreshTempDir("qlora-merged");
  Status status = SaveMerged(model, out);
  ASSERT_TRUE(status.ok()) << status.ToString();
  LlamaForCausalLM merged = TinyLlama(out, std::nullopt);
  merged->eval();
  for (auto& [name, projection] : merged->NamedProjections()) {
    EXPECT_FALSE(projection->is_quantized()) << name;
    EXPECT_FALSE(projection->has_adapter()) << name;
  }
  auto file = OpenExpected();
  const torch::Tensor input_ids = Expected(*file, "input_ids").clone();
  EXPECT_LE((LogitsOf(merged, input_ids) - LogitsOf(model, input_ids)).abs().max().item<double>(),
            1e-4);
  std::filesystem::remove_all(out);
}

// A demo model whose decoder projections are NF4 (random init), and a dense one whose projections
// hold those NF4 weights dequantised: DequantizeNf4(QuantizeNf4(W)).
struct QuantizedAndDense {
  LlamaForCausalLM quantized{nullptr};
  LlamaForCausalLM dense{nullptr};
};

QuantizedAndDense DemoQuantizedAndDense(torch::Dtype dtype, torch::ScalarType compute_dtype) {
  const ModelConfig& demo = *FindPreset("llmctl-demo");
  torch::manual_seed(11);
  auto quantized = BuildModel(demo, "random", "", dtype, torch::kCPU,
                              Nf4Options{.double_quant = true, .compute_dtype = compute_dtype});
  EXPECT_TRUE(quantized.ok()) << quantized.status().ToString();
  torch::manual_seed(11);
  auto dense = BuildModel(demo, "random", "", dtype, torch::kCPU);
  EXPECT_TRUE(dense.ok()) << dense.status().ToString();
  auto dense_projections = (*dense)->NamedProjections();
  auto quantized_projections = (*quantized)->NamedProjections();
  for (size_t i = 0; i < dense_projections.size(); ++i) {
    Projection& q = quantized_projections[i].second;
    // The same seed draws the same weights in the same order: where both are dense they agree.
    if (!q->is_quantized()) {
      EXPECT_TRUE(torch::equal(q->DenseWeight(), dense_projections[i].second->DenseWeight()));
      continue;
    }
    dense_projections[i].second->SetBaseWeight(q->DenseWeight());
  }
  return {*quantized, *dense};
}

TEST(QloraModelTest, LogitsEqualADenseModelOfTheDequantisedWeights) {
  struct Case {
    torch::Dtype dtype;
    torch::ScalarType compute_dtype;
    double tolerance;
  };
  // fp32: the same products, summed by matmul here and linear there. bf16-true: bf16 both ways.
  for (const Case& c : {Case{torch::kFloat32, torch::kFloat32, 1e-5},
                        Case{torch::kBFloat16, torch::kBFloat16, 1e-2}}) {
    QuantizedAndDense models = DemoQuantizedAndDense(c.dtype, c.compute_dtype);
    torch::manual_seed(12);
    const torch::Tensor ids = torch::randint(0, 2048, {2, 24}, torch::kInt64);
    const torch::Tensor want = LogitsOf(models.dense, ids).to(torch::kFloat32);
    const torch::Tensor got = LogitsOf(models.quantized, ids).to(torch::kFloat32);
    const double difference = (got - want).abs().max().item<double>();
    std::cout << "qlora vs dense dequantised, " << c10::toString(c.dtype) << ": max |dlogit| "
              << difference << " (logits up to " << want.abs().max().item<double>() << ")"
              << std::endl;
    EXPECT_LE(difference, c.tolerance) << c10::toString(c.dtype);
  }
}

TEST(QloraModelTest, OnlyTheAdaptersGetGradients) {
  QuantizedAndDense models = DemoQuantizedAndDense(torch::kFloat32, torch::kFloat32);
  LoraConfig config;
  config.options = {.r = 4, .alpha = 8.0, .dropout = 0.0};
  config.targets = {"q_proj", "down_proj", "lm_head"};
  ApplyLora(models.quantized, config);
  torch::manual_seed(13);
  const torch::Tensor ids = torch::randint(0, 2048, {2, 16}, torch::kInt64);
  CausalLmLoss(models.quantized->Logits(models.quantized->Hidden(ids, LlamaOptions{})), ids)
      .backward();
  for (const auto& item : models.quantized->named_parameters()) {
    EXPECT_EQ(item.value().grad().defined(), IsAdapterParameter(item.key())) << item.key();
  }
  for (const auto& item : models.quantized->named_buffers()) {
    EXPECT_FALSE(item.value().requires_grad()) << item.key();
  }
}

// An NF4 projection holds 4 bits per weight, one 8-bit absmax code per 64 weights, one fp32 nested
// absmax per 256 blocks and an fp32 offset, all as module buffers.
TEST(QloraMemoryTest, AnNf4ProjectionHoldsHalfAByteAParamPlusItsAbsmax) {
  const ModelConfig& demo = *FindPreset("llmctl-demo");
  auto model = BuildModel(demo, "random", "", torch::kBFloat16, torch::kCPU, Nf4Options{});
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  int64_t total_numel = 0;
  int64_t total_bytes = 0;
  for (auto& [name, projection] : (*model)->NamedProjections()) {
    if (!projection->is_quantized()) continue;
    const Nf4Weight& w = projection->nf4_weight();
    const int64_t n = w.numel();
    const int64_t blocks = (n + 63) / 64;
    EXPECT_EQ(w.bytes(), (n + 1) / 2 + blocks + 4 * ((blocks + 255) / 256) + 4) << name;
    std::vector<torch::Tensor> buffers;
    for (const torch::Tensor& b : projection->buffers()) buffers.push_back(b);
    EXPECT_EQ(UniqueStorageBytes(buffers), static_cast<uint64_t>(w.bytes())) << name;
    if (name.starts_with("model.layers.0.")) {
      std::cout << name << " (" << w.shape[0] << " x " << w.shape[1]
                << "): " << 8.0 * static_cast<double>(w.bytes()) / static_cast<double>(n)
                << " bits/param" << std::endl;
    }
    total_numel += n;
    total_bytes += w.bytes();
  }
  const double bits = 8.0 * static_cast<double>(total_bytes) / static_cast<double>(total_numel);
  RecordProperty("demo_projection_bits_per_param", std::to_string(bits));
  std::cout << "llmctl-demo decoder projections: " << bits << " bits/param" << std::endl;
  EXPECT_GT(bits, 4.125);
  EXPECT_LT(bits, 4.2);
}

// Loading a model whose dense fp32 decoder weights are far larger than any one of them: the peak
// holds the quantised model, the dense weights that stay dense (embeddings, norms) and the
// temporaries of quantising one weight, never the dense decoder.
TEST(QloraMemoryTest, LoadingNeverHoldsTheDenseDecoder) {
  ModelConfig config = *FindPreset("llmctl-demo");
  config.vocab_size = 256;
  config.hidden_size = 256;
  config.intermediate_size = 688;
  config.num_hidden_layers = 8;
  config.num_attention_heads = 8;
  config.num_key_value_heads = 8;
  config.head_dim = 32;
  const std::string dir = testing::FreshTempDir("qlora-load");
  {
    torch::manual_seed(14);
    auto dense = BuildModel(config, "random", "", torch::kFloat32, torch::kCPU);
    ASSERT_TRUE(dense.ok()) << dense.status().ToString();
    ASSERT_TRUE(SaveMerged(*dense, dir).ok());  // no adapters: the model as it is
  }
  auto memory = DeviceMemory::For(torch::kCPU);
  ASSERT_TRUE(memory.ok()) << memory.status().ToString();
  const uint64_t before = memory->allocated_bytes();
  memory->ResetPeak();
  auto model = BuildModel(config, "pretrained", dir, torch::kFloat32, torch::kCPU, Nf4Options{});
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  const uint64_t peak = memory->peak_bytes() - before;

  uint64_t quantized_bytes = 0;
  uint64_t dense_decoder_bytes = 0;
  uint64_t largest_dense_weight = 0;
  for (auto& [name, projection] : (*model)->NamedProjections()) {
    if (!projection->is_quantized()) continue;
    const uint64_t dense_bytes = 4 * static_cast<uint64_t>(projection->nf4_weight().numel());
    quantized_bytes += projection->nf4_weight().bytes();
    dense_decoder_bytes += dense_bytes;
    largest_dense_weight = std::max(largest_dense_weight, dense_bytes);
  }
  std::vector<torch::Tensor> parameters;
  for (const torch::Tensor& p : (*model)->parameters()) parameters.push_back(p);
  const uint64_t unquantized_bytes = UniqueStorageBytes(parameters);
  std::cout << "loading peak " << peak << " B: quantised decoder " << quantized_bytes
            << " B + dense rest " << unquantized_bytes << " B; one dense weight "
            << largest_dense_weight << " B; dense decoder " << dense_decoder_bytes << " B"
            << std::endl;
  RecordProperty("load_peak_bytes", std::to_string(peak));
  RecordProperty("dense_decoder_bytes", std::to_string(dense_decoder_bytes));
  // Quantising one weight holds it (fp32) plus its fp32 scaled copy and int32 code indices.
  EXPECT_LE(peak, quantized_bytes + unquantized_bytes + 4 * largest_dense_weight);
  EXPECT_LT(peak, dense_decoder_bytes / 3);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace llmctl::trainer
