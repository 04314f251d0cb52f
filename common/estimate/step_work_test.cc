// The work of one optimizer step counted from a trial and a model's shapes (step_work.h), by hand
// on a small LLaMA, and the time terms that follow from each kind of work.
#include "common/estimate/step_work.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <tuple>
#include <vector>

#include "common/estimate/step_time.h"
#include "common/estimate/step_work_test_support.h"

namespace llmctl::estimate {
namespace {

using nlohmann::json;
using test_support::kAttention;
using test_support::kHeadWeights;
using test_support::kLayerWeights;
using test_support::kTokens;
using test_support::SmallConfig;
using test_support::SmallModel;

TEST(StepWorkTest, CountsFullFineTuningMatmulsByHand) {
  StatusOr<StepWork> work = EstimateStepWork(SmallConfig({}), SmallModel());
  ASSERT_TRUE(work.ok()) << work.status().message();
  // Forward 2 t W, backward the input's and the weight's gradients 4 t W; attention 3x forward.
  const double expected = 6 * kTokens * (2 * kLayerWeights + kHeadWeights) + 2 * 3 * kAttention;
  EXPECT_DOUBLE_EQ(work->matmul_flops, expected);
  EXPECT_EQ(work->matmul_class, MatmulClass::kFp32);
  EXPECT_EQ(work->tokens, 64);
  EXPECT_EQ(work->micro_batches, 1);
}

// A step's element-wise ops run over one micro-batch's residual stream: (B, T, C) in the
// stream's dtype, fp32 under autocast (its norms and adds stay fp32), bf16 under bf16-true.
TEST(StepWorkTest, ElementwiseTensorIsAMicroBatchsStream) {
  for (const auto& [precision, element, c] : {std::tuple{"32-true", 4, MatmulClass::kFp32},
                                              std::tuple{"bf16-mixed", 4, MatmulClass::kFp32},
                                              std::tuple{"bf16-true", 2, MatmulClass::kBf16}}) {
    StatusOr<StepWork> work =
        EstimateStepWork(SmallConfig({{"precision", precision}}), SmallModel());
    ASSERT_TRUE(work.ok()) << work.status().message();
    EXPECT_EQ(work->elementwise_tensor_bytes, 2 * 32 * 64 * element) << precision;
    EXPECT_EQ(work->elementwise_class, c) << precision;
  }
}

// The layers' own element-wise traffic is LayerPasses' over each layer, token and micro-batch,
// by SmallModel's widths (h 64, q 64, kv 32, i 256) and its stream's and projections' elements:
// under aten (30 h s + 10 (q + kv) p + 5 i p + 2 (2q + 2kv) p + repeat_kv's 4 q p) a token, and
// fused (10 h s + 2 (q + kv) p + 3 i p + the same copies), through a forward and its backward
// (three passes), checkpointing's rerun a fourth. It is part of the traffic beyond the model's
// state, and keyed by the projections' dtype and the kernels.
TEST(StepWorkTest, LayerTrafficIsTheLayersElementwisePasses) {
  auto aten = [](double s, double p) {
    return 30 * 64 * s + 10 * 96 * p + 5 * 256 * p + 2 * 192 * p + 4 * 64 * p;
  };
  auto fused = [](double s, double p) {
    return 10 * 64 * s + 2 * 96 * p + 3 * 256 * p + 2 * 192 * p + 4 * 64 * p;
  };
  const double layer_tokens = 2 * kTokens;  // two layers, one micro-batch
  struct Case {
    std::vector<std::pair<const char*, const char*>> sets;
    double bytes;
    MatmulClass projected;
    Kernels kernels;
  };
  const Case cases[] = {
      {{{"kernels", "aten"}}, layer_tokens * 3 * aten(4, 4), MatmulClass::kFp32, Kernels::kAten},
      {{{"kernels", "fused"}}, layer_tokens * 3 * fused(4, 4), MatmulClass::kFp32, Kernels::kFused},
      {{{"kernels", "aten"}, {"precision", "bf16-mixed"}},
       layer_tokens * 3 * aten(4, 2),
       MatmulClass::kBf16,
       Kernels::kAten},
      {{{"kernels", "fused"}, {"precision", "bf16-true"}},
       layer_tokens * 3 * fused(2, 2),
       MatmulClass::kBf16,
       Kernels::kFused},
      {{{"kernels", "aten"}, {"activation_checkpointing", "true"}},
       layer_tokens * 4 * aten(4, 4),
       MatmulClass::kFp32,
       Kernels::kAten},
      {{{"kernels", "aten"}, {"train.global_batch_size", "6"}},
       3 * layer_tokens * 3 * aten(4, 4),
       MatmulClass::kFp32,
       Kernels::kAten}};
  for (const Case& c : cases) {
    TrialConfig config = SmallConfig({});
    for (const auto& [key, value] : c.sets) ASSERT_TRUE(config.SetFromText(key, value).ok()) << key;
    StatusOr<StepWork> work = EstimateStepWork(config, SmallModel());
    ASSERT_TRUE(work.ok()) << work.status().message();
    const std::string name = c.sets.back().first + std::string("=") + c.sets.back().second;
    EXPECT_DOUBLE_EQ(work->layer_memory_bytes, c.bytes) << name;
    EXPECT_EQ(work->layer_projected_class, c.projected) << name;
    EXPECT_EQ(work->layer_kernels, c.kernels) << name;
    EXPECT_LE(work->layer_memory_bytes + work->cast_memory_bytes,
              work->memory_bytes - work->state_memory_bytes)
        << name;
  }
}

// The traffic over the model's state is the optimizer's, the accumulation's and the embedding's
// dense gradient's: the optimizer and the accumulation move it and nothing else, and autocast's
// weight casts add to it.
TEST(StepWorkTest, StateTrafficIsTheOptimizersTheAccumulationsAndTheCasts) {
  const ModelStateEstimate state = *EstimateModelState(SmallConfig({}), SmallModel());
  const double trainable = static_cast<double>(state.parameters_trainable);
  StatusOr<StepWork> adamw =
      EstimateStepWork(SmallConfig({{"train.grad_clip", "0"}}), SmallModel());
  StatusOr<StepWork> sgd = EstimateStepWork(
      SmallConfig({{"train.grad_clip", "0"}, {"optimizer", "sgd"}, {"train.momentum", "0"}}),
      SmallModel());
  StatusOr<StepWork> two = EstimateStepWork(
      SmallConfig({{"train.grad_clip", "0"}, {"train.global_batch_size", "4"}}), SmallModel());
  StatusOr<StepWork> mixed = EstimateStepWork(
      SmallConfig({{"train.grad_clip", "0"}, {"precision", "bf16-mixed"}}), SmallModel());
  ASSERT_TRUE(adamw.ok() && sgd.ok() && two.ok() && mixed.ok());
  // A trained embedding's dense gradient, then AdamW's 7 passes over fp32 values.
  const double embedding = 1000.0 * 64 * 4;
  EXPECT_DOUBLE_EQ(adamw->state_memory_bytes, embedding + trainable * 7 * 4);
  EXPECT_LT(adamw->state_memory_bytes, adamw->memory_bytes);
  EXPECT_DOUBLE_EQ(adamw->state_memory_bytes - sgd->state_memory_bytes, trainable * 4 * 4);
  EXPECT_DOUBLE_EQ(adamw->memory_bytes - sgd->memory_bytes, trainable * 4 * 4);
  // A second micro-batch: its embedding gradient and an accumulation of every gradient.
  EXPECT_DOUBLE_EQ(two->state_memory_bytes - adamw->state_memory_bytes,
                   embedding + trainable * 3 * 4);
  EXPECT_GT(mixed->state_memory_bytes, adamw->state_memory_bytes);
}

// An offloaded optimizer on a CPU: no gradient accumulates on the device; each micro-batch's
// moves into its fp32 host buffer, written by the first and added to by the others, and the
// updated master weights are narrowed back into the parameters, all in the host's memory.
TEST(StepWorkTest, CpuOffloadTimesTheHostBuffersTraffic) {
  const ModelStateEstimate state = *EstimateModelState(SmallConfig({}), SmallModel());
  const double trainable = static_cast<double>(state.parameters_trainable);
  auto offloaded = [](const char* global_batch) {
    return EstimateStepWork(SmallConfig({{"train.grad_clip", "0"},
                                         {"precision", "bf16-true"},
                                         {"offload", "optimizer"},
                                         {"train.global_batch_size", global_batch}}),
                            SmallModel());
  };
  StatusOr<StepWork> one = offloaded("2"), two = offloaded("4");
  ASSERT_TRUE(one.ok() && two.ok());
  const double embedding = 1000.0 * 64 * 2;  // its dense bf16 gradient, each micro-batch
  // Widened in (2 B read, 4 written), narrowed back (4 read, 2 written); the update is the host
  // optimizer's own term.
  EXPECT_DOUBLE_EQ(one->state_memory_bytes, embedding + trainable * 12);
  EXPECT_DOUBLE_EQ(one->host_optimizer_values, trainable);
  // A second micro-batch adds its gradient to the buffer: 2 B and 4 read, 4 written.
  EXPECT_DOUBLE_EQ(two->state_memory_bytes - one->state_memory_bytes, embedding + trainable * 10);
}

// The projections' FLOPs by shape: each weight at the micro-batch's rows, forward and both
// gradients for a trained weight, every layer; attention apart; together the work's matmul FLOPs.
TEST(StepWorkTest, CountsEachProjectionShapesFlops) {
  StatusOr<StepWork> work = EstimateStepWork(SmallConfig({}), SmallModel());
  ASSERT_TRUE(work.ok()) << work.status().message();
  auto flops_at = [&](int64_t in, int64_t out) {
    for (const MatmulShape& s : work->matmul_shapes) {
      if (s.rows == kTokens && s.in == in && s.out == out) return s.flops;
    }
    return -1.0;
  };
  // q_proj and o_proj (64 x 64); k_proj and v_proj (64 x 32); gate and up (64 x 256); down.
  EXPECT_DOUBLE_EQ(flops_at(64, 64), 2 * 2 * 6 * kTokens * 64 * 64);
  EXPECT_DOUBLE_EQ(flops_at(64, 32), 2 * 2 * 6 * kTokens * 64 * 32);
  EXPECT_DOUBLE_EQ(flops_at(64, 256), 2 * 2 * 6 * kTokens * 64 * 256);
  EXPECT_DOUBLE_EQ(flops_at(256, 64), 2 * 6 * kTokens * 256 * 64);
  EXPECT_DOUBLE_EQ(flops_at(64, 1000), 6 * kTokens * kHeadWeights);
  EXPECT_EQ(work->matmul_shapes.size(), 5u);
  EXPECT_DOUBLE_EQ(work->attention_flops, 2 * 3 * kAttention);
  // One shape: a row's tokens (data.max_seq_length), not the batch's, on the model's heads.
  ASSERT_EQ(work->attention_shapes.size(), 1u);
  EXPECT_EQ(work->attention_shapes[0].queries, 32);
  EXPECT_EQ(work->attention_shapes[0].keys, 32);
  EXPECT_EQ(work->attention_shapes[0].head_width, SmallModel().head_dim);
  EXPECT_DOUBLE_EQ(work->attention_shapes[0].flops, work->attention_flops);
  double sum = work->attention_flops;
  for (const MatmulShape& s : work->matmul_shapes) sum += s.flops;
  EXPECT_DOUBLE_EQ(sum, work->matmul_flops);
}

// LoRA's adapters are shapes of their own (rows x in x r, rows x r x out), the frozen weights'
// forward and input gradient stay at theirs; checkpointing reruns the layers' forward, not the
// head's; accumulation multiplies every shape.
TEST(StepWorkTest, ShapesFollowAdaptersCheckpointingAndAccumulation) {
  StatusOr<StepWork> lora = EstimateStepWork(SmallConfig({{"peft.method", "lora"},
                                                          {"peft.r", "4"},
                                                          {"peft.targets", "[q_proj]"},
                                                          {"activation_checkpointing", "true"},
                                                          {"train.global_batch_size", "4"}}),
                                             SmallModel());
  ASSERT_TRUE(lora.ok()) << lora.status().message();
  ASSERT_EQ(lora->micro_batches, 2);
  auto flops_at = [&](int64_t in, int64_t out) {
    for (const MatmulShape& s : lora->matmul_shapes) {
      if (s.rows == kTokens && s.in == in && s.out == out) return s.flops;
    }
    return -1.0;
  };
  // Two micro-batches; per layer forward twice (the rerun) and the input's gradient once.
  EXPECT_DOUBLE_EQ(flops_at(64, 64), 2 * 2 * 3 * 2 * kTokens * 64 * 64 * 2);
  EXPECT_DOUBLE_EQ(flops_at(64, 4),
                   2 * 2 * 4 * 2 * kTokens * 64 * 4);  // forward twice, 2 gradients
  EXPECT_DOUBLE_EQ(flops_at(4, 64), 2 * 2 * 4 * 2 * kTokens * 4 * 64);
  EXPECT_DOUBLE_EQ(flops_at(64, 1000), 2 * 2 * 2 * kTokens * kHeadWeights);  // no rerun
  double sum = lora->attention_flops;
  for (const MatmulShape& s : lora->matmul_shapes) sum += s.flops;
  EXPECT_DOUBLE_EQ(sum, lora->matmul_flops);
}

TEST(StepWorkTest, CheckpointingAddsOneForwardOfEveryLayer) {
  StatusOr<StepWork> plain = EstimateStepWork(SmallConfig({}), SmallModel());
  StatusOr<StepWork> recomputed =
      EstimateStepWork(SmallConfig({{"activation_checkpointing", "true"}}), SmallModel());
  ASSERT_TRUE(plain.ok() && recomputed.ok());
  EXPECT_DOUBLE_EQ(recomputed->matmul_flops - plain->matmul_flops,
                   2 * (2 * kTokens * kLayerWeights + kAttention));
  EXPECT_GT(recomputed->memory_bytes, plain->memory_bytes);
  EXPECT_GT(recomputed->launches, plain->launches);
}

TEST(StepWorkTest, AccumulationMultipliesTheMicroBatchWork) {
  StatusOr<StepWork> one = EstimateStepWork(SmallConfig({}), SmallModel());
  StatusOr<StepWork> four =
      EstimateStepWork(SmallConfig({{"train.global_batch_size", "8"}}), SmallModel());
  ASSERT_TRUE(one.ok() && four.ok());
  EXPECT_EQ(four->micro_batches, 4);
  EXPECT_EQ(four->tokens, 4 * one->tokens);
  EXPECT_DOUBLE_EQ(four->matmul_flops, 4 * one->matmul_flops);
}

TEST(StepWorkTest, DdpSendsEachGradientTwiceOverTheRing) {
  StatusOr<StepWork> ddp = EstimateStepWork(
      SmallConfig({{"strategy", "ddp"}, {"devices", "4"}, {"train.global_batch_size", "8"}}),
      SmallModel());
  ASSERT_TRUE(ddp.ok()) << ddp.status().message();
  const double parameters = 2 * (kLayerWeights + 2 * 64) + 64 + 2 * kHeadWeights;
  EXPECT_DOUBLE_EQ(ddp->interconnect_bytes, 2 * 0.75 * parameters * 4);
  EXPECT_EQ(ddp->network_bytes, 0);
}

// The CPU's 8-bit AdamW step is its own term (bound by its code searches, at the probe's or the
// sheet's 8-bit rate), one value per trainable value; CUDA's is memory traffic, p, g and the two
// 1-byte moments read and written.
TEST(StepWorkTest, EightBitAdamWIsItsOwnWorkOnTheCpuAndMemoryOnCuda) {
  StatusOr<StepWork> adamw = EstimateStepWork(SmallConfig({}), SmallModel());
  StatusOr<StepWork> cpu =
      EstimateStepWork(SmallConfig({{"optimizer", "adamw_8bit"}}), SmallModel());
  StatusOr<StepWork> cuda = EstimateStepWork(
      SmallConfig({{"optimizer", "adamw_8bit"}, {"device", "cuda"}}), SmallModel());
  StatusOr<StepWork> adamw_cuda = EstimateStepWork(SmallConfig({{"device", "cuda"}}), SmallModel());
  ASSERT_TRUE(adamw.ok() && cpu.ok() && cuda.ok() && adamw_cuda.ok());
  const double parameters = 2 * (kLayerWeights + 2 * 64) + 64 + 2 * kHeadWeights;
  EXPECT_DOUBLE_EQ(cpu->adamw_8bit_values, parameters);
  // AdamW's 7 fp32 passes (p, g, m, v read; p, m, v written) are not there.
  EXPECT_DOUBLE_EQ(cpu->memory_bytes, adamw->memory_bytes - parameters * 7 * 4);
  EXPECT_EQ(cuda->adamw_8bit_values, 0);
  EXPECT_DOUBLE_EQ(cuda->memory_bytes,
                   adamw_cuda->memory_bytes - parameters * 7 * 4 + parameters * (3 * 4 + 4));
  const TimeEstimate time = EstimateTime(*cpu, CpuSpeed(), Calibration{}, 0);
  double eight_bit = -1;
  for (const TimeTerm& term : time.terms) {
    if (term.name == "8-bit AdamW") eight_bit = term.seconds;
  }
  // The sheet's rate: 12 ns a value (240 B of traffic's worth at the CPU's nominal 20 GB/s).
  EXPECT_DOUBLE_EQ(eight_bit, parameters / (20e9 / 240));
  // Timed on a GPU's speed, as the fuzz target times every work on every device, it is finite.
  const TimeEstimate on_gpu =
      EstimateTime(*cpu, GpuSpeed(*GpuNamed("h100-80gb")), Calibration{}, 0);
  EXPECT_TRUE(std::isfinite(on_gpu.step_seconds) && on_gpu.step_seconds > 0);
  // A work stored before the field existed reads as none.
  json stored = cpu->ToJson();
  stored.erase("adamw_8bit_values");
  StatusOr<StepWork> old = StepWork::FromJson(stored);
  ASSERT_TRUE(old.ok()) << old.status().message();
  EXPECT_EQ(old->adamw_8bit_values, 0);
}

// A host's ranks share its cores (the launcher gives each 1/R of them): on a CPU the work a probe
// timed over all the threads (GEMMs, attention, memory, the loss, the optimizer steps) takes R
// times as long on each of a host's R ranks, and what one thread does anyway (each op's dispatch,
// dropout's draws) keeps its time; ranks on hosts of their own share nothing. On a GPU only the
// host's offloaded optimizer step is shared.
TEST(StepWorkTest, AHostsRanksShareItsCores) {
  const auto terms_of = [](const StepWork& work, const DeviceSpeed& speed) {
    std::map<std::string, double> seconds;
    for (const TimeTerm& term : EstimateTime(work, speed, Calibration{}, 0).terms) {
      seconds[term.name] = term.seconds;
    }
    return seconds;
  };
  StatusOr<StepWork> one = EstimateStepWork(
      SmallConfig({{"optimizer", "adamw_8bit"}, {"peft.method", "lora"}, {"peft.dropout", "0.1"}}),
      SmallModel());
  ASSERT_TRUE(one.ok()) << one.status().message();
  StepWork two_ranks = *one;  // the same work a rank, two of them on one host
  two_ranks.world_size = 2;
  StepWork two_hosts = two_ranks;
  two_hosts.nodes = 2;
  const std::map<std::string, double> alone = terms_of(*one, CpuSpeed());
  const std::map<std::string, double> shared = terms_of(two_ranks, CpuSpeed());
  for (const char* parallel : {"matmuls", "memory", "8-bit AdamW", "loss"}) {
    ASSERT_TRUE(alone.contains(parallel)) << parallel;
    EXPECT_DOUBLE_EQ(shared.at(parallel), 2 * alone.at(parallel)) << parallel;
  }
  for (const char* serial : {"launches", "dropout"}) {
    ASSERT_TRUE(alone.contains(serial)) << serial;
    EXPECT_DOUBLE_EQ(shared.at(serial), alone.at(serial)) << serial;
  }
  EXPECT_EQ(terms_of(two_hosts, CpuSpeed()), alone);

  StatusOr<StepWork> offloaded =
      EstimateStepWork(SmallConfig({{"device", "cuda"}, {"offload", "optimizer"}}), SmallModel());
  ASSERT_TRUE(offloaded.ok()) << offloaded.status().message();
  StepWork offloaded_two = *offloaded;
  offloaded_two.world_size = 2;
  const DeviceSpeed h100 = GpuSpeed(*GpuNamed("h100-80gb"));
  const std::map<std::string, double> gpu_alone = terms_of(*offloaded, h100);
  const std::map<std::string, double> gpu_shared = terms_of(offloaded_two, h100);
  ASSERT_TRUE(gpu_alone.contains("host optimizer"));
  EXPECT_DOUBLE_EQ(gpu_shared.at("host optimizer"), 2 * gpu_alone.at("host optimizer"));
  EXPECT_DOUBLE_EQ(gpu_shared.at("matmuls"), gpu_alone.at("matmuls"));
}

// A CPU step's loss is its logits, by the kernels that run it and their dtype, timed at the rate
// for those (an exp a logit bounds it, not its bytes); CUDA's is memory traffic, as before 12-02.
TEST(StepWorkTest, TheCpuLossIsItsLogitsAtItsKernelsRateAndCudasIsMemory) {
  StatusOr<StepWork> fused = EstimateStepWork(SmallConfig({}), SmallModel());
  StatusOr<StepWork> aten = EstimateStepWork(SmallConfig({{"kernels", "aten"}}), SmallModel());
  StatusOr<StepWork> bf16 =
      EstimateStepWork(SmallConfig({{"precision", "bf16-true"}}), SmallModel());
  StatusOr<StepWork> accumulated =
      EstimateStepWork(SmallConfig({{"train.global_batch_size", "6"}}), SmallModel());
  StatusOr<StepWork> cuda = EstimateStepWork(SmallConfig({{"device", "cuda"}}), SmallModel());
  StatusOr<StepWork> cuda_aten =
      EstimateStepWork(SmallConfig({{"device", "cuda"}, {"kernels", "aten"}}), SmallModel());
  ASSERT_TRUE(fused.ok() && aten.ok() && bf16.ok() && accumulated.ok() && cuda.ok() &&
              cuda_aten.ok());
  // Every token's logits over the 1,000-token vocabulary, each micro-batch's.
  EXPECT_DOUBLE_EQ(fused->loss_logits, kTokens * 1000);
  EXPECT_EQ(fused->loss_kernels, Kernels::kFused);
  EXPECT_EQ(fused->loss_class, MatmulClass::kFp32);
  EXPECT_DOUBLE_EQ(aten->loss_logits, kTokens * 1000);
  EXPECT_EQ(aten->loss_kernels, Kernels::kAten);
  EXPECT_EQ(bf16->loss_class, MatmulClass::kBf16);
  EXPECT_DOUBLE_EQ(accumulated->loss_logits, 3 * kTokens * 1000);
  // Not memory on the CPU: the same bytes whichever kernels run the loss (the layers' passes
  // apart, which differ by kernels too, the loss adds none).
  EXPECT_EQ(cuda->loss_logits, 0);
  EXPECT_DOUBLE_EQ(cuda->memory_bytes - fused->memory_bytes, kTokens * 1000 * 20);
  EXPECT_DOUBLE_EQ(cuda_aten->memory_bytes - aten->memory_bytes, kTokens * 1000 * (4 + 36));

  auto loss_seconds = [](const StepWork& w, const DeviceSpeed& d) {
    for (const TimeTerm& term : EstimateTime(w, d, Calibration{}, 0).terms) {
      if (term.name == "loss") return term.seconds;
    }
    return -1.0;
  };
  const DeviceSpeed sheet = CpuSpeed();
  EXPECT_DOUBLE_EQ(loss_seconds(*fused, sheet),
                   kTokens * 1000 / sheet.loss_logits_per_s.fused_fp32);
  EXPECT_DOUBLE_EQ(loss_seconds(*aten, sheet), kTokens * 1000 / sheet.loss_logits_per_s.aten_fp32);
  EXPECT_DOUBLE_EQ(loss_seconds(*bf16, sheet), kTokens * 1000 / sheet.loss_logits_per_s.fused_bf16);
  // A machine whose ATen loss runs at twice the rate takes half the time over it, and the fused
  // loss' time is its own.
  DeviceSpeed quicker = sheet;
  quicker.loss_logits_per_s.aten_fp32 *= 2;
  EXPECT_DOUBLE_EQ(loss_seconds(*aten, quicker), loss_seconds(*aten, sheet) / 2);
  EXPECT_DOUBLE_EQ(loss_seconds(*fused, quicker), loss_seconds(*fused, sheet));
  // A device without loss rates (a GPU's sheet) times a CPU work's loss as a GPU's bytes.
  const DeviceSpeed h100 = GpuSpeed(*GpuNamed("h100-80gb"));
  EXPECT_DOUBLE_EQ(loss_seconds(*aten, h100), kTokens * 1000 * (4 + 36) / h100.memory_bytes_per_s);
  EXPECT_EQ(loss_seconds(*cuda, h100), -1.0);  // in the memory term

  StatusOr<StepWork> back = StepWork::FromJson(bf16->ToJson());
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ(back->loss_logits, bf16->loss_logits);
  EXPECT_EQ(back->loss_kernels, Kernels::kFused);
  EXPECT_EQ(back->loss_class, MatmulClass::kBf16);
  json stored = aten->ToJson();
  for (const char* key : {"loss_logits", "loss_kernels", "loss_class"}) stored.erase(key);
  EXPECT_EQ(StepWork::FromJson(stored)->loss_logits, 0);  // stored before 12-02: in its bytes
  json bad = aten->ToJson();
  bad["loss_kernels"] = "liger";
  EXPECT_FALSE(StepWork::FromJson(bad).ok());
  bad = aten->ToJson();
  bad["loss_class"] = "fp8";
  EXPECT_FALSE(StepWork::FromJson(bad).ok());
}

// A micro-batch at a length new to the run costs its weight shapes' kernels once more (a probe's
// cells and reference steps measure what each costs): the term is the micro-batches at new lengths
// times each distinct weight shape's cost by its values, plus a part a micro-batch; taken as
// measured (no factor).
TEST(StepWorkTest, MicroBatchesAtNewLengthsCostTheirWeightShapes) {
  StatusOr<StepWork> work = EstimateStepWork(SmallConfig({}), SmallModel());
  ASSERT_TRUE(work.ok());
  EXPECT_EQ(work->new_length_micro_batches, 0);  // full sequences: every step's alike
  // q_proj and o_proj share 64 x 64; k and v 64 x 32; gate and up 64 x 256; down; the head.
  const std::vector<WeightShape> weights = WeightShapes(*work, MatmulClass::kFp32);
  ASSERT_EQ(weights.size(), 5u);
  double values = 0;
  for (const WeightShape& w : weights) values += w.values();
  EXPECT_EQ(values, 64 * 64 + 64 * 32 + 2 * 64 * 256 + 64 * SmallModel().vocab_size);
  work->new_length_micro_batches = 0.5;
  DeviceSpeed speed = CpuSpeed();
  speed.bf16_new_length = {.per_micro_batch = 1};  // the other class's
  // 2 ms at 4,096 values, 3 ms at 16,384: every shape here between or past them.
  speed.fp32_new_length = {.by_values = {{4096, 2e-3}, {16384, 3e-3}}, .per_micro_batch = 1e-3};
  const auto shape = [](double values) {
    return values <= 4096 ? 2e-3 : 2e-3 + 1e-3 * (values - 4096) / (16384 - 4096);
  };
  double shapes = 0;
  for (const WeightShape& w : weights) shapes += shape(w.values());
  Calibration twice;
  twice.bf16_factor = 2;
  twice.fp32_factor = 2;
  const TimeEstimate time = EstimateTime(*work, speed, twice, 0);
  double new_lengths = -1;
  for (const TimeTerm& term : time.terms) {
    if (term.name == "new lengths") {
      new_lengths = term.seconds;
      EXPECT_FALSE(term.calibrated);
    }
  }
  EXPECT_DOUBLE_EQ(new_lengths, 0.5 * (1e-3 + shapes));
  // Between the cells linear, below the first its cost, past the last the last two's slope on,
  // never below the last; one cell every shape's.
  const NewLengthCost& cost = speed.fp32_new_length;
  EXPECT_EQ(cost.ShapeSeconds(2048, 128), 2e-3);
  EXPECT_DOUBLE_EQ(cost.ShapeSeconds(10240, 128), 2.5e-3);
  EXPECT_DOUBLE_EQ(cost.ShapeSeconds(28672, 128), 4e-3);
  // Cells of one row count (every probe's before version 18) price any rows alike.
  EXPECT_DOUBLE_EQ(cost.ShapeSeconds(10240, 4096), 2.5e-3);
  const NewLengthCost falling = {.by_values = {{4096, 2e-3}, {16384, 1e-3}}};
  EXPECT_EQ(falling.ShapeSeconds(1e6, 128), 1e-3);
  const NewLengthCost one = {.by_values = {{0, 5e-3}}};
  EXPECT_EQ(one.ShapeSeconds(1e6, 128), 5e-3);
  EXPECT_EQ(NewLengthCost{}.ShapeSeconds(1e6, 128), 0);
  // A micro-batch's part below 0 (the reference's GEMMs over its cells) takes no more than all.
  speed.fp32_new_length.per_micro_batch = -1;
  EXPECT_EQ(speed.fp32_new_length.MicroBatchSeconds(weights), 0);
  EXPECT_EQ(speed.fp32_new_length.MicroBatchSeconds({}), 0);
  json stored = work->ToJson();
  EXPECT_EQ(StepWork::FromJson(stored)->new_length_micro_batches, 0.5);
  stored["new_length_micro_batches"] = 2;  // more than its one micro-batch
  EXPECT_EQ(StepWork::FromJson(stored).status().message(),
            "step work: new_length_micro_batches exceeds micro_batches");
}

// A run's padded lengths each take their share of the micro-batches at their own attention FLOPs
// (the square of the length): the mean of 16 and 48 costs 1.25x what the mean length, 32, does.
// The matmul FLOPs, which hold attention's, move with them, and the work round-trips through its
// JSON. A work of several attention shapes (a BLIP-2 step's), or no lengths, is left as it is.
TEST(StepWorkTest, AttentionIsCountedAtEachPaddedLengthTheRunDraws) {
  StatusOr<StepWork> work = EstimateStepWork(SmallConfig({}), SmallModel());  // 32 tokens
  ASSERT_TRUE(work.ok()) << work.status().message();
  ASSERT_EQ(work->attention_shapes.size(), 1u);
  const StepWork counted = *work;
  const double attention = counted.attention_flops;
  SpreadAttentionOverLengths({{16, 3}, {48, 3}}, *work);
  ASSERT_EQ(work->attention_shapes.size(), 2u);
  EXPECT_EQ(work->attention_shapes[0].queries, 16);
  EXPECT_EQ(work->attention_shapes[0].keys, 16);
  EXPECT_EQ(work->attention_shapes[1].queries, 48);
  EXPECT_EQ(work->attention_shapes[1].head_width, counted.attention_shapes[0].head_width);
  EXPECT_DOUBLE_EQ(work->attention_shapes[0].flops, attention * 0.25 / 2);
  EXPECT_DOUBLE_EQ(work->attention_shapes[1].flops, attention * 2.25 / 2);
  EXPECT_DOUBLE_EQ(work->attention_flops, 1.25 * attention);
  EXPECT_DOUBLE_EQ(work->matmul_flops, counted.matmul_flops + 0.25 * attention);
  StatusOr<StepWork> back = StepWork::FromJson(work->ToJson());
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ(back->attention_shapes.size(), 2u);
  // One length: the same FLOPs at it.
  StepWork one = counted;
  SpreadAttentionOverLengths({{32, 5}}, one);
  EXPECT_DOUBLE_EQ(one.attention_flops, attention);
  EXPECT_DOUBLE_EQ(one.matmul_flops, counted.matmul_flops);
  // Lengths padded to one 32-query block: one shape at their root-mean-square length, the same
  // FLOPs.
  StepWork block = counted;
  SpreadAttentionOverLengths({{40, 1}, {56, 1}}, block);
  ASSERT_EQ(block.attention_shapes.size(), 1u);
  EXPECT_DOUBLE_EQ(block.attention_shapes[0].queries, std::sqrt((40.0 * 40 + 56.0 * 56) / 2));
  EXPECT_DOUBLE_EQ(block.attention_flops, attention * (40.0 * 40 + 56.0 * 56) / 2 / (32 * 32));
  // A real dataset's hundreds of lengths: at most kMaxSpreadAttentionShapes shapes, whose FLOPs
  // are still the lengths' mean.
  std::map<int64_t, int64_t> many;
  double squares = 0;
  for (int64_t length = 1; length <= 20000; length += 7) {
    many[length] = 2;
    squares += 2.0 * static_cast<double>(length * length);
  }
  StepWork spread = counted;
  SpreadAttentionOverLengths(many, spread);
  EXPECT_LE(spread.attention_shapes.size(), kMaxSpreadAttentionShapes);
  EXPECT_GT(spread.attention_shapes.size(), kMaxSpreadAttentionShapes / 2);
  EXPECT_NEAR(spread.attention_flops,
              attention * squares / (2.0 * static_cast<double>(many.size())) / (32 * 32),
              1e-9 * spread.attention_flops);
  ASSERT_TRUE(StepWork::FromJson(spread.ToJson()).ok());
  // No lengths, or two shapes already: unchanged.
  StepWork none = counted;
  SpreadAttentionOverLengths({}, none);
  EXPECT_EQ(none.attention_flops, attention);
  StepWork two = counted;
  two.attention_shapes.push_back({.queries = 32, .keys = 8, .head_width = 16, .flops = 0});
  SpreadAttentionOverLengths({{16, 1}}, two);
  EXPECT_EQ(two.attention_shapes.size(), 2u);
  EXPECT_EQ(two.attention_flops, attention);
}

// Cells at two row counts (version 18): at each its own values' rule, and past the later one's
// most values the first's cost scaled by their ratio there; between them linear in log(rows),
// outside them the nearest one's. A weight shape carries its matmuls' most rows, at which a
// micro-batch's new length is priced.
TEST(StepWorkTest, ANewLengthCostsByTheRowsOfItsMicroBatch) {
  const NewLengthCost cost = {.by_values = {{.values = 4096, .seconds = 2e-3, .rows = 128},
                                            {.values = 16384, .seconds = 3e-3, .rows = 128},
                                            {.values = 4096, .seconds = 4e-3, .rows = 512}}};
  EXPECT_DOUBLE_EQ(cost.ShapeSeconds(10240, 128), 2.5e-3);
  EXPECT_DOUBLE_EQ(cost.ShapeSeconds(2048, 512), 4e-3);  // below its one cell, the cell's
  // Past it (4,096 values, 2x the 128 rows' 2 ms there), 2x the 128 rows' cost.
  EXPECT_DOUBLE_EQ(cost.ShapeSeconds(10240, 512), 5e-3);
  EXPECT_DOUBLE_EQ(cost.ShapeSeconds(16384, 512), 6e-3);
  EXPECT_DOUBLE_EQ(cost.ShapeSeconds(10240, 64), 2.5e-3);
  EXPECT_DOUBLE_EQ(cost.ShapeSeconds(10240, 2048), 5e-3);
  EXPECT_DOUBLE_EQ(cost.ShapeSeconds(10240, 256), (2.5e-3 + 5e-3) / 2);  // halfway in log(rows)
  EXPECT_DOUBLE_EQ(cost.WeightSeconds({.in = 64, .out = 160, .frozen = true, .rows = 256}),
                   (2.5e-3 + 5e-3) / 2 * 2 / 3);
  // A micro-batch of 4 x 32 tokens: every weight's matmuls at 128 rows.
  StatusOr<StepWork> work = EstimateStepWork(
      SmallConfig({{"train.micro_batch_size", "4"}, {"train.global_batch_size", "4"}}),
      SmallModel());
  ASSERT_TRUE(work.ok()) << work.status().message();
  const std::vector<WeightShape> weights = WeightShapes(*work, MatmulClass::kFp32);
  ASSERT_FALSE(weights.empty());
  for (const WeightShape& w : weights) EXPECT_EQ(w.rows, 128) << w.in << " x " << w.out;
}

// A frozen weight's backward skips its gradient, two of a trained projection's three GEMMs: under
// LoRA the base projections and the untrained head are frozen, the adapters trained, and a new
// length costs a frozen weight two thirds of the cells' cost at its values. The flag round-trips
// through the work's JSON (absent: trained, as a work stored before it).
TEST(StepWorkTest, AFrozenWeightsNewLengthCostsTwoOfItsThreeGemms) {
  StatusOr<StepWork> lora = EstimateStepWork(
      SmallConfig({{"peft.method", "lora"}, {"peft.r", "4"}, {"peft.targets", "[q_proj]"}}),
      SmallModel());
  ASSERT_TRUE(lora.ok());
  const std::vector<WeightShape> weights = WeightShapes(*lora, MatmulClass::kFp32);
  int frozen = 0, trained = 0;
  for (const WeightShape& w : weights) {
    // The adapter's A (64 x 4) and B (4 x 64) are trained; every other weight is frozen.
    const bool adapter = w.in == 4 || w.out == 4;
    EXPECT_EQ(w.frozen, !adapter) << w.in << " x " << w.out;
    (w.frozen ? frozen : trained) += 1;
  }
  EXPECT_EQ(trained, 2);
  EXPECT_EQ(frozen, 5);
  const NewLengthCost cost = {.by_values = {{0, 3e-3}}};
  EXPECT_DOUBLE_EQ(cost.MicroBatchSeconds(weights), 2 * 3e-3 + 5 * 2e-3);
  StatusOr<StepWork> full = EstimateStepWork(SmallConfig({}), SmallModel());
  ASSERT_TRUE(full.ok());
  for (const WeightShape& w : WeightShapes(*full, MatmulClass::kFp32)) EXPECT_FALSE(w.frozen);
  json stored = lora->ToJson();
  StatusOr<StepWork> back = StepWork::FromJson(stored);
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ(back->ToJson(), stored);
  EXPECT_EQ(WeightShapes(*back, MatmulClass::kFp32), weights);
  for (json& shape : stored["matmul_shapes"]) shape.erase("frozen");
  for (const WeightShape& w : WeightShapes(*StepWork::FromJson(stored), MatmulClass::kFp32)) {
    EXPECT_FALSE(w.frozen);
  }
  stored["matmul_shapes"][0]["frozen"] = "yes";
  EXPECT_EQ(StepWork::FromJson(stored).status().message(),
            "step work: matmul_shapes[0].frozen must be true or false");
}

}  // namespace
}  // namespace llmctl::estimate
