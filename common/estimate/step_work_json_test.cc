// A step's work as it is stored with each prediction (step_work_json.cc): it round-trips, reads
// the works stored before a field was added, and refuses a broken one naming the field.
#include <gtest/gtest.h>

#include <limits>
#include <nlohmann/json.hpp>
#include <string>

#include "common/estimate/step_time.h"
#include "common/estimate/step_work.h"
#include "common/estimate/step_work_test_support.h"

namespace llmctl::estimate {
namespace {

using nlohmann::json;
using test_support::SmallConfig;
using test_support::SmallModel;

// A work stored before the shapes were counted reads, every FLOP then at one rate; a shape's
// broken field is refused by name, and shapes that add up to more than the work's FLOPs too.
TEST(StepWorkTest, MatmulShapesAreOptionalAndChecked) {
  StatusOr<StepWork> work = EstimateStepWork(SmallConfig({}), SmallModel());
  ASSERT_TRUE(work.ok());
  json old = work->ToJson();
  old.erase("matmul_shapes");
  old.erase("attention_flops");
  old.erase("attention_shapes");
  StatusOr<StepWork> read = StepWork::FromJson(old);
  ASSERT_TRUE(read.ok()) << read.status().message();
  EXPECT_TRUE(read->matmul_shapes.empty());
  EXPECT_EQ(read->attention_flops, 0);
  EXPECT_TRUE(read->attention_shapes.empty());
  json broken = work->ToJson();
  broken["matmul_shapes"][1]["in"] = 0;
  EXPECT_EQ(StepWork::FromJson(broken).status().message(),
            "step work: matmul_shapes[1].in must be a positive integer");
  broken = work->ToJson();
  broken["matmul_shapes"][0].erase("flops");
  EXPECT_EQ(StepWork::FromJson(broken).status().message(),
            "step work: matmul_shapes[0].flops must be a finite non-negative number");
  broken = work->ToJson();
  broken["matmul_shapes"] = "wide";
  EXPECT_EQ(StepWork::FromJson(broken).status().message(),
            "step work: matmul_shapes must be a list");
  broken = work->ToJson();
  broken["matmul_flops"] = work->matmul_flops / 2;
  EXPECT_EQ(StepWork::FromJson(broken).status().message(),
            "step work: matmul_shapes' and attention_flops' FLOPs exceed matmul_flops");
}

// Attention's shapes round-trip. A work stored before them (12-01) had one sequence length and
// head width for all its attention, read as one shape; one stored before those (11-30) had
// neither, read at the probe's 128 tokens on 64-wide heads. A shape's broken field is refused by
// name, and shapes whose FLOPs do not add up to attention_flops too.
// A captioning step's image pixels round-trip; a work stored before them reads with none; a
// negative count is refused by name.
TEST(StepWorkTest, ImagePixelsRoundTripAreOptionalAndChecked) {
  StatusOr<StepWork> work = EstimateStepWork(SmallConfig({}), SmallModel());
  ASSERT_TRUE(work.ok());
  work->jpeg_pixels = 4.9e6;
  work->png_pixels = 2.6e5;
  StatusOr<StepWork> again = StepWork::FromJson(work->ToJson());
  ASSERT_TRUE(again.ok()) << again.status().message();
  EXPECT_EQ(again->jpeg_pixels, 4.9e6);
  EXPECT_EQ(again->png_pixels, 2.6e5);
  json old = work->ToJson();
  old.erase("jpeg_pixels");
  old.erase("png_pixels");
  StatusOr<StepWork> read = StepWork::FromJson(old);
  ASSERT_TRUE(read.ok()) << read.status().message();
  EXPECT_EQ(read->jpeg_pixels, 0);
  EXPECT_EQ(read->png_pixels, 0);
  old["png_pixels"] = -1;
  EXPECT_EQ(StepWork::FromJson(old).status().message(),
            "step work: png_pixels must be a finite non-negative number");
}

TEST(StepWorkTest, AttentionShapesRoundTripOlderWorksReadAsOneAndBrokenOnesAreRefused) {
  StatusOr<StepWork> work = EstimateStepWork(SmallConfig({}), SmallModel());
  ASSERT_TRUE(work.ok());
  work->attention_shapes.push_back({.queries = 8, .keys = 40, .head_width = 24, .flops = 1e6});
  work->attention_flops += 1e6;
  work->matmul_flops += 1e6;
  StatusOr<StepWork> again = StepWork::FromJson(work->ToJson());
  ASSERT_TRUE(again.ok()) << again.status().message();
  ASSERT_EQ(again->attention_shapes.size(), 2u);
  EXPECT_EQ(again->attention_shapes[1].queries, 8);
  EXPECT_EQ(again->attention_shapes[1].keys, 40);
  EXPECT_EQ(again->attention_shapes[1].head_width, 24);
  EXPECT_EQ(again->attention_shapes[1].flops, 1e6);
  EXPECT_EQ(again->ToJson(), work->ToJson());

  json old = work->ToJson();
  old.erase("attention_shapes");
  old["attention_seq"] = 82.5;
  old["attention_head_width"] = 24;
  StatusOr<StepWork> read = StepWork::FromJson(old);
  ASSERT_TRUE(read.ok()) << read.status().message();
  ASSERT_EQ(read->attention_shapes.size(), 1u);
  EXPECT_EQ(read->attention_shapes[0].queries, 82.5);
  EXPECT_EQ(read->attention_shapes[0].keys, 82.5);
  EXPECT_EQ(read->attention_shapes[0].head_width, 24);
  EXPECT_EQ(read->attention_shapes[0].flops, work->attention_flops);
  old.erase("attention_seq");
  old.erase("attention_head_width");
  read = StepWork::FromJson(old);
  ASSERT_TRUE(read.ok()) << read.status().message();
  ASSERT_EQ(read->attention_shapes.size(), 1u);
  EXPECT_EQ(read->attention_shapes[0].queries, kProbeAttentionTokens);
  EXPECT_EQ(read->attention_shapes[0].head_width, kProbeAttentionHeadWidth);
  old["attention_seq"] = -64;
  EXPECT_EQ(StepWork::FromJson(old).status().message(),
            "step work: attention_seq must be a finite non-negative number");

  json broken = work->ToJson();
  broken["attention_shapes"][1]["keys"] = 0;
  const std::string out_of_range =
      " must have 1 to 1048576 queries and keys and a head 1 to 65536 wide";
  EXPECT_EQ(StepWork::FromJson(broken).status().message(),
            "step work: attention_shapes[1]" + out_of_range);
  broken = work->ToJson();
  broken["attention_shapes"][0]["queries"] = 1e300;
  EXPECT_EQ(StepWork::FromJson(broken).status().message(),
            "step work: attention_shapes[0]" + out_of_range);
  broken = work->ToJson();
  broken["attention_shapes"][0].erase("head_width");
  EXPECT_EQ(StepWork::FromJson(broken).status().message(),
            "step work: attention_shapes[0].head_width must be a finite non-negative number");
  broken = work->ToJson();
  broken["attention_shapes"][0] = 3;
  EXPECT_EQ(StepWork::FromJson(broken).status().message(),
            "step work: attention_shapes[0] must be an object");
  broken = work->ToJson();
  broken["attention_shapes"] = "long";
  EXPECT_EQ(StepWork::FromJson(broken).status().message(),
            "step work: attention_shapes must be a list");
  broken = work->ToJson();
  broken["attention_shapes"][1]["flops"] = 2e6;
  EXPECT_EQ(StepWork::FromJson(broken).status().message(),
            "step work: attention_shapes' FLOPs do not add up to attention_flops");
}

// The classes round-trip; a work stored before them reads with every shape and attention in the
// work's class; a class that is not bf16 or fp32 is refused by name.
TEST(StepWorkTest, ShapeAndAttentionClassesRoundTripAndAreChecked) {
  StatusOr<StepWork> work = EstimateStepWork(
      SmallConfig({{"peft.method", "qlora"}, {"peft.r", "4"}, {"peft.targets", "[q_proj]"}}),
      SmallModel());
  ASSERT_TRUE(work.ok()) << work.status().message();
  StatusOr<StepWork> again = StepWork::FromJson(work->ToJson());
  ASSERT_TRUE(again.ok()) << again.status().message();
  EXPECT_EQ(again->ToJson(), work->ToJson());
  EXPECT_EQ(again->attention_class, MatmulClass::kFp32);
  json old = work->ToJson();
  old.erase("attention_class");
  for (json& shape : old["matmul_shapes"]) shape.erase("class");
  StatusOr<StepWork> read = StepWork::FromJson(old);
  ASSERT_TRUE(read.ok()) << read.status().message();
  EXPECT_EQ(AttentionClass(*read), MatmulClass::kBf16);
  for (const MatmulShape& s : read->matmul_shapes) {
    EXPECT_EQ(ShapeClass(*read, s), MatmulClass::kBf16);
  }
  json broken = work->ToJson();
  broken["matmul_shapes"][2]["class"] = "fp64";
  EXPECT_EQ(StepWork::FromJson(broken).status().message(),
            "step work: matmul_shapes[2].class must be bf16 or fp32");
  broken = work->ToJson();
  broken["attention_class"] = 16;
  EXPECT_EQ(StepWork::FromJson(broken).status().message(),
            "step work: attention_class must be bf16 or fp32");
}

// The element-wise tensor's size and dtype round-trip; a work stored before them reads as none
// (the one memory rate), and a broken one is refused by name.
TEST(StepWorkTest, ElementwiseTensorRoundTripsIsOptionalAndChecked) {
  StatusOr<StepWork> work =
      EstimateStepWork(SmallConfig({{"precision", "bf16-true"}}), SmallModel());
  ASSERT_TRUE(work.ok()) << work.status().message();
  StatusOr<StepWork> again = StepWork::FromJson(work->ToJson());
  ASSERT_TRUE(again.ok()) << again.status().message();
  EXPECT_EQ(again->elementwise_tensor_bytes, work->elementwise_tensor_bytes);
  EXPECT_EQ(again->elementwise_class, MatmulClass::kBf16);
  json old = work->ToJson();
  old.erase("elementwise_tensor_bytes");
  old.erase("elementwise_class");
  old.erase("state_memory_bytes");
  StatusOr<StepWork> read = StepWork::FromJson(old);
  ASSERT_TRUE(read.ok()) << read.status().message();
  EXPECT_EQ(read->elementwise_tensor_bytes, 0);
  EXPECT_EQ(read->state_memory_bytes, 0);
  EXPECT_EQ(again->state_memory_bytes, work->state_memory_bytes);
  EXPECT_GT(again->state_memory_bytes, 0);
  json broken = work->ToJson();
  broken["state_memory_bytes"] = work->memory_bytes * 2;
  EXPECT_EQ(StepWork::FromJson(broken).status().message(),
            "step work: state_memory_bytes exceeds memory_bytes");
  broken = work->ToJson();
  broken["elementwise_tensor_bytes"] = -1;
  EXPECT_EQ(StepWork::FromJson(broken).status().message(),
            "step work: elementwise_tensor_bytes must be a finite non-negative number");
  broken = work->ToJson();
  broken["elementwise_class"] = "fp8";
  EXPECT_EQ(StepWork::FromJson(broken).status().message(),
            "step work: elementwise_class must be bf16 or fp32");
}

// The part of the memory traffic converted between dtypes (12-06): it round-trips, a work stored
// before it reads as none, and more than the traffic beyond the model's state is refused.
TEST(StepWorkTest, CastBytesRoundTripAreOptionalAndChecked) {
  StatusOr<StepWork> work =
      EstimateStepWork(SmallConfig({{"precision", "bf16-mixed"}}), SmallModel());
  ASSERT_TRUE(work.ok()) << work.status().message();
  ASSERT_GT(work->cast_memory_bytes, 0);
  StatusOr<StepWork> again = StepWork::FromJson(work->ToJson());
  ASSERT_TRUE(again.ok()) << again.status().message();
  EXPECT_EQ(again->cast_memory_bytes, work->cast_memory_bytes);
  json old = work->ToJson();
  old.erase("cast_memory_bytes");
  StatusOr<StepWork> read = StepWork::FromJson(old);
  ASSERT_TRUE(read.ok()) << read.status().message();
  EXPECT_EQ(read->cast_memory_bytes, 0);
  json broken = work->ToJson();
  broken["cast_memory_bytes"] = work->memory_bytes - work->state_memory_bytes + 1e6;
  EXPECT_EQ(StepWork::FromJson(broken).status().message(),
            "step work: cast_memory_bytes exceeds memory_bytes beyond state_memory_bytes");
  broken["cast_memory_bytes"] = -1;
  EXPECT_EQ(StepWork::FromJson(broken).status().message(),
            "step work: cast_memory_bytes must be a finite non-negative number");
}

TEST(StepWorkTest, JsonRoundTripsAndRejectsMissingFields) {
  StatusOr<StepWork> work = EstimateStepWork(SmallConfig({}), SmallModel());
  ASSERT_TRUE(work.ok());
  StatusOr<StepWork> back = StepWork::FromJson(work->ToJson());
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ(back->ToJson(), work->ToJson());
  json broken = work->ToJson();
  broken.erase("memory_bytes");
  EXPECT_EQ(StepWork::FromJson(broken).status().message(),
            "step work: memory_bytes must be a finite non-negative number");
  // A non-finite figure (JSON has no infinity: a stored one reads back as null) is refused too.
  broken = work->ToJson();
  broken["matmul_flops"] = std::numeric_limits<double>::infinity();
  EXPECT_EQ(StepWork::FromJson(broken).status().message(),
            "step work: matmul_flops must be a finite non-negative number");
  broken = work->ToJson();
  broken["matmul_class"] = "int8";
  EXPECT_FALSE(StepWork::FromJson(broken).ok());
  // Members of another type (another process's JSON) are refused, never thrown.
  broken = work->ToJson();
  broken["family"] = 7;
  EXPECT_EQ(StepWork::FromJson(broken).status().message(),
            "step work: family must be llama or blip2");
  broken = work->ToJson();
  broken["pretrained"] = "yes";
  EXPECT_EQ(StepWork::FromJson(broken).status().message(),
            "step work: pretrained must be true or false");
  // A work stored before BLIP-2 and pretrained weights: a LLaMA's, built from random init.
  broken = work->ToJson();
  broken.erase("family");
  broken.erase("pretrained");
  ASSERT_TRUE(StepWork::FromJson(broken).ok());
  EXPECT_EQ(StepWork::FromJson(broken)->family, ModelFamily::kLlama);
  EXPECT_FALSE(StepWork::FromJson(broken)->pretrained);
}

// The layers' own element-wise traffic with its dtype and kernels (the sixty-third stop)
// round-trips; a work stored before it reads as none (the element-wise rate for all of it), and a
// broken one, or one that with the casts exceeds the traffic beyond the model's state, is refused
// by name.
TEST(StepWorkTest, LayerBytesRoundTripAreOptionalAndChecked) {
  StatusOr<StepWork> work = EstimateStepWork(
      SmallConfig({{"precision", "bf16-mixed"}, {"kernels", "fused"}}), SmallModel());
  ASSERT_TRUE(work.ok()) << work.status().message();
  ASSERT_GT(work->layer_memory_bytes, 0);
  StatusOr<StepWork> again = StepWork::FromJson(work->ToJson());
  ASSERT_TRUE(again.ok()) << again.status().message();
  EXPECT_EQ(again->layer_memory_bytes, work->layer_memory_bytes);
  EXPECT_EQ(again->layer_projected_class, MatmulClass::kBf16);
  EXPECT_EQ(again->layer_kernels, Kernels::kFused);
  json old = work->ToJson();
  old.erase("layer_memory_bytes");
  old.erase("layer_projected_class");
  old.erase("layer_kernels");
  StatusOr<StepWork> read = StepWork::FromJson(old);
  ASSERT_TRUE(read.ok()) << read.status().message();
  EXPECT_EQ(read->layer_memory_bytes, 0);
  json broken = work->ToJson();
  broken["layer_memory_bytes"] =
      work->memory_bytes - work->state_memory_bytes - work->cast_memory_bytes + 1e3;
  EXPECT_EQ(StepWork::FromJson(broken).status().message(),
            "step work: layer_memory_bytes and cast_memory_bytes exceed memory_bytes beyond "
            "state_memory_bytes");
  broken = work->ToJson();
  broken["layer_memory_bytes"] = "many";
  EXPECT_EQ(StepWork::FromJson(broken).status().message(),
            "step work: layer_memory_bytes must be a finite non-negative number");
  broken = work->ToJson();
  broken["layer_projected_class"] = "fp8";
  EXPECT_EQ(StepWork::FromJson(broken).status().message(),
            "step work: layer_projected_class must be bf16 or fp32");
  broken = work->ToJson();
  broken.erase("layer_kernels");
  EXPECT_EQ(StepWork::FromJson(broken).status().message(),
            "step work: layer_kernels must be aten or fused");
}

}  // namespace
}  // namespace llmctl::estimate
