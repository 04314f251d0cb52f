// What a probe's cells of a step's whole parts say, as the arithmetic says (a fixed probe:
// rate_probe_test_support.h): the reference steps' calibration and a new length's cost, the
// new-shape cells that split it by weight, and the element-wise and layer cells that time the
// memory traffic. The probe's GEMM and attention rates: probed_speed_test.cc.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "common/estimate/rate_probe.h"
#include "common/estimate/rate_probe_test_support.h"
#include "common/estimate/reference_step.h"

namespace llmctl::estimate {
namespace {

using test_support::FixedProbe;
using test_support::TermSeconds;

TEST(RateProbeTest, ReferenceStepsAreTheNodesOwnCalibration) {
  const DeviceSpeed sheet = CpuSpeed();
  RateProbe probe = FixedProbe();
  const DeviceSpeed uncalibrated = ProbedSpeed(sheet, probe, "a probe");
  auto nominal = [&](MatmulClass c) {
    StatusOr<StepWork> work = ReferenceWork(c);
    EXPECT_TRUE(work.ok()) << work.status().message();
    return NominalStepSeconds(*work, uncalibrated);
  };
  const NominalStep fp32 = nominal(MatmulClass::kFp32);
  const NominalStep bf16 = nominal(MatmulClass::kBf16);
  ASSERT_GT(fp32.calibrated, 0);
  ASSERT_GT(bf16.calibrated, 0);
  // The steps took 1.5x and 0.8x their nominal calibrated time beyond the fixed terms.
  probe.reference_steps = {{"fp32", fp32.fixed + 1.5 * fp32.calibrated},
                           {"bf16", bf16.fixed + 0.8 * bf16.calibrated}};
  const DeviceSpeed probed = ProbedSpeed(sheet, probe, "a probe");
  EXPECT_DOUBLE_EQ(probed.probed_fp32_factor, 1.5);
  EXPECT_DOUBLE_EQ(probed.probed_bf16_factor, 0.8);
  const Calibration llama = DefaultCalibration(probed, ModelFamily::kLlama);
  EXPECT_DOUBLE_EQ(llama.Factor(MatmulClass::kFp32), 1.5);
  EXPECT_DOUBLE_EQ(llama.Factor(MatmulClass::kBf16), 0.8);
  EXPECT_NE(llama.source.find("reference steps"), std::string::npos) << llama.source;
  EXPECT_EQ(DefaultCalibration(probed, ModelFamily::kBlip2).Factor(MatmulClass::kFp32), 1);
  // Stored runs of the device still take over: Calibrate starts from this default.
  probe.reference_steps = {{"fp32", fp32.fixed + 1.5 * fp32.calibrated}};
  const Calibration one =
      DefaultCalibration(ProbedSpeed(sheet, probe, "a probe"), ModelFamily::kLlama);
  EXPECT_DOUBLE_EQ(one.Factor(MatmulClass::kBf16), 1.5);
  // A step no longer than its fixed terms measures no factor.
  probe.reference_steps = {{"fp32", fp32.fixed}};
  EXPECT_EQ(ProbedSpeed(sheet, probe, "a probe").probed_fp32_factor, 0);
}

bool Unmeasured(const NewLengthCost& cost) { return !cost.measured(); }

// With steps at new lengths and at repeated ones (version 5) the factor is the repeated step's,
// and the difference, over the step's micro-batches and the reference work's distinct weight
// shapes, is what each shape of a micro-batch at a new length costs; never below 0. A version 4
// probe's only step (at new lengths) keeps giving the factor, and no such cost.
TEST(RateProbeTest, ReferenceStepsAtNewAndRepeatedLengthsPriceANewLength) {
  const DeviceSpeed sheet = CpuSpeed();
  RateProbe probe = FixedProbe();
  const DeviceSpeed uncalibrated = ProbedSpeed(sheet, probe, "a probe");
  StatusOr<StepWork> work = ReferenceWork(MatmulClass::kBf16);
  ASSERT_TRUE(work.ok()) << work.status().message();
  ASSERT_EQ(work->micro_batches, 2);
  // 512 x 512 (q, k, v, o), 512 x 1,408 (gate, up), 1,408 x 512 (down), 512 x 4,096 (the head).
  ASSERT_EQ(WeightShapes(*work, MatmulClass::kBf16).size(), 4u);
  const NominalStep bf16 = NominalStepSeconds(*work, uncalibrated);
  const double repeated = bf16.fixed + 1.2 * bf16.calibrated;
  probe.reference_steps = {{"bf16", repeated + 0.016, true}, {"bf16", repeated, false}};
  const DeviceSpeed probed = ProbedSpeed(sheet, probe, "a probe");
  EXPECT_DOUBLE_EQ(probed.probed_bf16_factor, 1.2);
  // Without new_shapes cells (a version 13 probe's) each weight shape an equal part.
  ASSERT_EQ(probed.bf16_new_length.by_values.size(), 1u);
  EXPECT_NEAR(probed.bf16_new_length.ShapeSeconds(1e6, 128), 0.016 / 2 / 4, 1e-15);
  EXPECT_EQ(probed.bf16_new_length.per_micro_batch, 0);
  EXPECT_TRUE(Unmeasured(probed.fp32_new_length));
  // A new-length step quicker than the repeated one prices nothing, and bounds the repeated
  // step's time: the factor is its own.
  probe.reference_steps = {{"bf16", bf16.fixed + 1.1 * bf16.calibrated, true},
                           {"bf16", repeated, false}};
  const DeviceSpeed bounded = ProbedSpeed(sheet, probe, "a probe");
  EXPECT_TRUE(Unmeasured(bounded.bf16_new_length));
  EXPECT_DOUBLE_EQ(bounded.probed_bf16_factor, 1.1);
  // Version 4: the one step.
  probe.reference_steps = {{"bf16", repeated, true}};
  const DeviceSpeed four = ProbedSpeed(sheet, probe, "a probe");
  EXPECT_DOUBLE_EQ(four.probed_bf16_factor, 1.2);
  EXPECT_TRUE(Unmeasured(four.bf16_new_length));
  // The JSON says which step is which, and version 5 must.
  probe.reference_steps = {{"bf16", repeated + 0.016, true}, {"bf16", repeated, false}};
  nlohmann::json j = nlohmann::json::parse(probe.ToJson().dump());
  EXPECT_EQ(j["reference_steps"][0]["lengths"], "new");
  EXPECT_EQ(j["reference_steps"][1]["lengths"], "repeated");
  StatusOr<RateProbe> back = RateProbe::FromJson(j);
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ(back->ToJson(), probe.ToJson());
  j["reference_steps"][1]["lengths"] = "sometimes";
  EXPECT_NE(RateProbe::FromJson(j).status().message().find("'reference_steps[1].lengths'"),
            std::string::npos);
  j["reference_steps"][1].erase("lengths");
  EXPECT_NE(
      RateProbe::FromJson(j).status().message().find("'reference_steps[1].lengths' is missing"),
      std::string::npos);
}

// The bf16 reference work's weight shapes (512 x 512, 512 x 1,408, 1,408 x 512, 512 x 4,096) and
// its step's seconds at repeated lengths at `probe`'s rates and a factor of 1.2.
std::pair<std::vector<WeightShape>, double> Bf16ReferenceAt(const RateProbe& probe) {
  StatusOr<StepWork> work = ReferenceWork(MatmulClass::kBf16);
  EXPECT_TRUE(work.ok()) << work.status().message();
  if (!work.ok()) return {};
  const NominalStep bf16 = NominalStepSeconds(*work, ProbedSpeed(CpuSpeed(), probe, "a probe"));
  return {WeightShapes(*work, MatmulClass::kBf16), bf16.fixed + 1.2 * bf16.calibrated};
}

// With new_shapes cells (version 14) a weight shape's cost is the cells' (new over repeated, cells
// of one size averaged, none below 0) by its values, and the rest of the reference steps'
// difference a micro-batch is a micro-batch's own part; without cells of the class, or without a
// difference, as before. The cells round-trip through the JSON, which refuses a broken one by
// name.
TEST(RateProbeTest, NewShapeCellsSplitANewLengthByWeight) {
  const DeviceSpeed sheet = CpuSpeed();
  RateProbe probe = FixedProbe();
  const auto [weights, repeated] = Bf16ReferenceAt(probe);
  ASSERT_EQ(weights.size(), 4u);
  const double micro_batch = 0.043;  // the step at new lengths' more, over its 2 micro-batches
  probe.reference_steps = {{"bf16", repeated + 2 * micro_batch, true}, {"bf16", repeated, false}};
  const auto cell = [](int64_t in, int64_t out, double more) {
    return ProbedNewShape{"bf16", in, out, 128, 1e-3 + more, 1e-3};
  };
  probe.new_shapes = {cell(128, 128, 3e-3),  cell(512, 512, 5e-3),   cell(512, 1408, 6e-3),
                      cell(1408, 512, 8e-3), cell(512, 4096, 15e-3), cell(2048, 4096, 25e-3)};
  const NewLengthCost cost = ProbedSpeed(sheet, probe, "a probe").bf16_new_length;
  ASSERT_EQ(cost.by_values.size(), 5u);  // 512 x 1,408's two averaged
  EXPECT_EQ(cost.by_values[2].values, 512 * 1408);
  EXPECT_DOUBLE_EQ(cost.by_values[2].seconds, 7e-3);
  EXPECT_NEAR(cost.per_micro_batch, micro_batch - (5e-3 + 7e-3 + 7e-3 + 15e-3), 1e-12);
  EXPECT_NEAR(cost.MicroBatchSeconds(weights), micro_batch, 1e-12);
  EXPECT_TRUE(Unmeasured(ProbedSpeed(sheet, probe, "a probe").fp32_new_length));
  // A cell quicker at new rows than at repeated ones costs nothing.
  probe.new_shapes[0].new_seconds = 0.5e-3;
  EXPECT_EQ(ProbedSpeed(sheet, probe, "a probe").bf16_new_length.by_values[0].seconds, 0);
  // No difference between the steps: nothing, whatever the cells.
  probe.reference_steps = {{"bf16", repeated, true}, {"bf16", repeated, false}};
  EXPECT_TRUE(Unmeasured(ProbedSpeed(sheet, probe, "a probe").bf16_new_length));
  // The JSON.
  probe.new_shapes = {cell(128, 128, 3e-3), cell(512, 1408, 6e-3)};
  nlohmann::json j = nlohmann::json::parse(probe.ToJson().dump());
  ASSERT_EQ(j["new_shapes"].size(), 2u);
  EXPECT_EQ(j["new_shapes"][1]["out"], 1408);
  StatusOr<RateProbe> back = RateProbe::FromJson(j);
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ(back->ToJson(), probe.ToJson());
  for (const auto& [field, value, problem] :
       {std::tuple{"in", nlohmann::json(0), "must be an integer from 1 to 1048576"},
        std::tuple{"rows", nlohmann::json(1.5), "must be an integer from 1 to 1048576"},
        std::tuple{"dtype", nlohmann::json("fp16"), "must be fp32 or bf16"},
        std::tuple{"new_seconds", nlohmann::json(-1), "must be 0 (not measured) or from"}}) {
    nlohmann::json broken = j;
    broken["new_shapes"][1][field] = value;
    EXPECT_NE(RateProbe::FromJson(broken).status().message().find(std::string("'new_shapes[1].") +
                                                                  field + "' " + problem),
              std::string::npos)
        << field << ": " << RateProbe::FromJson(broken).status().message();
  }
  nlohmann::json missing = j;
  missing.erase("new_shapes");
  EXPECT_NE(RateProbe::FromJson(missing).status().message().find("'new_shapes' must be a list"),
            std::string::npos);
  missing["version"] = 13;  // before the cells: none
  EXPECT_TRUE(RateProbe::FromJson(missing).ok());
}

// Cells at two row counts (version 18) price the reference's own weights at its micro-batch's rows
// (2 rows of kReferenceTokens), between the two in log(rows), so the part a micro-batch has beyond
// its GEMMs is what their cost there leaves of the steps' difference; and a trial's micro-batch at
// more rows pays the more rows' cost.
TEST(RateProbeTest, NewShapeCellsAtTwoRowCountsPriceTheReferencesOwnRows) {
  const DeviceSpeed sheet = CpuSpeed();
  RateProbe probe = FixedProbe();
  const auto [weights, repeated] = Bf16ReferenceAt(probe);
  ASSERT_EQ(weights.size(), 4u);
  for (const WeightShape& w : weights) EXPECT_EQ(w.rows, 2 * kReferenceTokens);
  const double micro_batch = 0.05;
  probe.reference_steps = {{"bf16", repeated + 2 * micro_batch, true}, {"bf16", repeated, false}};
  // Every weight 4 ms at 128 rows, 10 ms at 512.
  probe.new_shapes = {{"bf16", 512, 512, 128, 5e-3, 1e-3}, {"bf16", 512, 512, 512, 12e-3, 2e-3}};
  const NewLengthCost cost = ProbedSpeed(sheet, probe, "a probe").bf16_new_length;
  ASSERT_EQ(cost.by_values.size(), 2u);
  EXPECT_EQ(cost.by_values[1].rows, 512);
  const double at_reference = 4e-3 + 6e-3 * std::log(224.0 / 128) / std::log(4.0);
  EXPECT_NEAR(cost.per_micro_batch, micro_batch - 4 * at_reference, 1e-12);
  EXPECT_NEAR(cost.MicroBatchSeconds(weights), micro_batch, 1e-12);
  std::vector<WeightShape> wider = weights;
  for (WeightShape& w : wider) w.rows = 600;
  EXPECT_NEAR(cost.MicroBatchSeconds(wider), micro_batch + 4 * (10e-3 - at_reference), 1e-12);
}

// With elementwise cells (version 15) a step's memory traffic takes the rate of its stream's dtype
// at its stream's tensor size, linear in log(bytes) between the cells around it and the nearest
// one's outside, and its traffic over the model's state the memory copy's; a work that says no size
// (stored before, or a BLIP-2's) and a probe without cells of the dtype keep the one memory rate.
// The cells round-trip through the JSON, which refuses a broken one by name and any on a GPU.
TEST(RateProbeTest, ElementwiseCellsTimeTheMemoryTrafficAtTheStreamsSize) {
  RateProbe probe = FixedProbe();
  probe.elementwise = {{"fp32", 1 << 20, 1.5e11},
                       {"fp32", 256 << 10, 1e11},
                       {"fp32", 16 << 20, 3e10},
                       {"bf16", 1 << 20, 5e10}};
  const DeviceSpeed speed = ProbedSpeed(CpuSpeed(), probe, "a probe");
  ASSERT_EQ(speed.fp32_elementwise.size(), 3u);  // fewest bytes first
  EXPECT_EQ(speed.fp32_elementwise.front().tensor_bytes, 256 << 10);
  EXPECT_DOUBLE_EQ(ElementwiseRateAt(speed.fp32_elementwise, 512 << 10), 1.25e11);
  EXPECT_DOUBLE_EQ(ElementwiseRateAt(speed.fp32_elementwise, 4 << 20), 9e10);  // halfway in log
  EXPECT_DOUBLE_EQ(ElementwiseRateAt(speed.fp32_elementwise, 1024), 1e11);
  EXPECT_DOUBLE_EQ(ElementwiseRateAt(speed.fp32_elementwise, 1e12), 3e10);

  StepWork work;
  work.tokens = 1024;
  work.micro_batches = 1;
  work.memory_bytes = 1e9;
  work.elementwise_tensor_bytes = 512 << 10;
  const Calibration none = {.source = "none"};
  auto memory_seconds = [&](const StepWork& w, const DeviceSpeed& d) {
    return TermSeconds(EstimateTime(w, d, none, 0), "memory");
  };
  EXPECT_DOUBLE_EQ(memory_seconds(work, speed), 1e9 / 1.25e11);
  const TimeEstimate estimate = EstimateTime(work, speed, none, 0);
  const auto memory = std::find_if(estimate.terms.begin(), estimate.terms.end(),
                                   [](const TimeTerm& t) { return t.name == "memory"; });
  ASSERT_NE(memory, estimate.terms.end());
  EXPECT_NE(memory->formula.find("fp32 element-wise at 524 kB tensors)"), std::string::npos)
      << memory->formula;
  // Its dtype casts are named, and take the same rate.
  work.cast_memory_bytes = 3e8;
  EXPECT_DOUBLE_EQ(memory_seconds(work, speed), 1e9 / 1.25e11);
  const TimeEstimate with_casts = EstimateTime(work, speed, none, 0);
  const auto cast_memory = std::find_if(with_casts.terms.begin(), with_casts.terms.end(),
                                        [](const TimeTerm& t) { return t.name == "memory"; });
  ASSERT_NE(cast_memory, with_casts.terms.end());
  EXPECT_NE(cast_memory->formula.find("524 kB tensors, of it 300 MB dtype casts)"),
            std::string::npos)
      << cast_memory->formula;
  work.cast_memory_bytes = 0;
  // The traffic over the model's state at the memory copy's rate.
  work.state_memory_bytes = 4e8;
  EXPECT_DOUBLE_EQ(memory_seconds(work, speed), 6e8 / 1.25e11 + 4e8 / probe.memory_bytes_per_s);
  work.state_memory_bytes = 0;
  work.elementwise_class = MatmulClass::kBf16;
  EXPECT_DOUBLE_EQ(memory_seconds(work, speed), 1e9 / 5e10);
  work.elementwise_tensor_bytes = 0;
  EXPECT_DOUBLE_EQ(memory_seconds(work, speed), 1e9 / probe.memory_bytes_per_s);
  work.elementwise_tensor_bytes = 512 << 10;
  EXPECT_DOUBLE_EQ(memory_seconds(work, ProbedSpeed(CpuSpeed(), FixedProbe(), "a probe")),
                   1e9 / probe.memory_bytes_per_s);

  nlohmann::json j = nlohmann::json::parse(probe.ToJson().dump());
  ASSERT_EQ(j["elementwise"].size(), 4u);
  StatusOr<RateProbe> back = RateProbe::FromJson(j);
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ(back->ToJson(), probe.ToJson());
  for (const auto& [field, value, problem] :
       {std::tuple{"bytes", nlohmann::json(0), "must be an integer from 1 to 1099511627776"},
        std::tuple{"bytes", nlohmann::json(2.5), "must be an integer from 1 to 1099511627776"},
        std::tuple{"dtype", nlohmann::json("fp16"), "must be fp32 or bf16"},
        std::tuple{"bytes_per_s", nlohmann::json(-1), "must be 0 (not measured) or from"}}) {
    nlohmann::json broken = j;
    broken["elementwise"][1][field] = value;
    EXPECT_NE(RateProbe::FromJson(broken).status().message().find(std::string("'elementwise[1].") +
                                                                  field + "' " + problem),
              std::string::npos)
        << field << ": " << RateProbe::FromJson(broken).status().message();
  }
  nlohmann::json on_gpu = j;
  on_gpu["identity"]["device"] = "cuda";
  EXPECT_NE(RateProbe::FromJson(on_gpu).status().message().find("'elementwise' must be empty"),
            std::string::npos)
      << RateProbe::FromJson(on_gpu).status().message();
  nlohmann::json missing = j;
  missing.erase("elementwise");
  EXPECT_NE(RateProbe::FromJson(missing).status().message().find("'elementwise' must be a list"),
            std::string::npos);
  missing["version"] = 14;  // before the cells: none
  StatusOr<RateProbe> v14 = RateProbe::FromJson(missing);
  ASSERT_TRUE(v14.ok()) << v14.status().message();
  EXPECT_TRUE(ProbedSpeed(CpuSpeed(), *v14, "a probe").fp32_elementwise.empty());
}

// With layer cells (version 16) the layers' own element-wise traffic takes their rate: the bytes
// LayerElementwiseBytes counts for a cell over its seconds less its ops' dispatch at the probe's
// launch time (the step's launches count that), by the work's stream and projections' dtypes and
// its kernels, at its stream's tensor size; the rest of the activations' traffic keeps the
// element-wise product's rate. The layer ops are a term of their own, calibrated as the rest. A
// work that says no layer bytes (stored before), or whose dtypes or kernels no cell measured, takes
// the product's rate for all of it. The cells round-trip through the
// JSON, which refuses a broken one by name and any on a GPU, and a version 15 probe has none.
TEST(RateProbeTest, LayerCellsTimeTheLayersElementwiseOps) {
  RateProbe probe = FixedProbe();
  probe.elementwise = {{"fp32", 1 << 20, 1.5e11}};
  probe.layer_elementwise = {{"fp32", "fp32", "aten", 512, 512, 512, 512, 1408, 0.006},
                             {"fp32", "fp32", "aten", 128, 512, 512, 512, 1408, 0.002},
                             {"bf16", "bf16", "fused", 512, 512, 512, 512, 1408, 0.004}};
  const DeviceSpeed speed = ProbedSpeed(CpuSpeed(), probe, "a probe");
  ASSERT_EQ(speed.layer_elementwise.size(), 3u);
  const LayerWidths widths = {.hidden = 512, .q = 512, .kv = 512, .inter = 1408};
  auto cell_rate = [&](double tokens, Kernels kernels, double seconds) {
    return tokens * LayerElementwiseBytes(widths, 4, 4, kernels) /
           (seconds - LayerElementwiseLaunches(kernels) * probe.launch_seconds);
  };
  const double at_128 = cell_rate(128, Kernels::kAten, 0.002);
  const double at_512 = cell_rate(512, Kernels::kAten, 0.006);

  StepWork work;
  work.tokens = 1024;
  work.micro_batches = 1;
  work.memory_bytes = 1e9;
  work.layer_memory_bytes = 6e8;
  work.elementwise_tensor_bytes = 512 * 512 * 4;  // the 512-token cell's stream
  const Calibration none = {.source = "none"};
  auto seconds_of = [&](const StepWork& w, const char* term) {
    return TermSeconds(EstimateTime(w, speed, none, 0), term);
  };
  EXPECT_DOUBLE_EQ(LayerElementwiseRateAt(speed.layer_elementwise, work), at_512);
  EXPECT_DOUBLE_EQ(seconds_of(work, "layer ops"), 6e8 / at_512);
  EXPECT_DOUBLE_EQ(seconds_of(work, "memory"), 4e8 / 1.5e11);
  // Both are calibrated.
  const Calibration doubled = {.bf16_factor = 2, .fp32_factor = 2, .source = "doubled"};
  const TimeEstimate scaled = EstimateTime(work, speed, doubled, 0);
  EXPECT_DOUBLE_EQ(TermSeconds(scaled, "layer ops"), 2 * 6e8 / at_512);
  EXPECT_DOUBLE_EQ(TermSeconds(scaled, "memory"), 2 * 4e8 / 1.5e11);
  const TimeEstimate estimate = EstimateTime(work, speed, none, 0);
  const auto layer_ops = std::find_if(estimate.terms.begin(), estimate.terms.end(),
                                      [](const TimeTerm& t) { return t.name == "layer ops"; });
  ASSERT_NE(layer_ops, estimate.terms.end());
  EXPECT_TRUE(layer_ops->calibrated);
  EXPECT_NE(layer_ops->formula.find("600 MB / "), std::string::npos) << layer_ops->formula;
  EXPECT_NE(layer_ops->formula.find("(aten norms, RoPE, activation, residual adds and layout "
                                    "copies: fp32 stream, fp32 projections)"),
            std::string::npos)
      << layer_ops->formula;
  const auto memory = std::find_if(estimate.terms.begin(), estimate.terms.end(),
                                   [](const TimeTerm& t) { return t.name == "memory"; });
  ASSERT_NE(memory, estimate.terms.end());
  EXPECT_TRUE(memory->formula.starts_with("400 MB / 150 GB/s")) << memory->formula;
  // Halfway in log(bytes) between the cells, the mean of their rates.
  work.elementwise_tensor_bytes = 256 * 512 * 4;
  EXPECT_DOUBLE_EQ(LayerElementwiseRateAt(speed.layer_elementwise, work), (at_128 + at_512) / 2);
  work.elementwise_tensor_bytes = 512 * 512 * 4;
  // No cell of these kernels in fp32, or no layer bytes: the element-wise product's rate.
  work.layer_kernels = Kernels::kFused;
  EXPECT_EQ(LayerElementwiseRateAt(speed.layer_elementwise, work), 0);
  EXPECT_EQ(seconds_of(work, "layer ops"), -1);  // no such term
  EXPECT_DOUBLE_EQ(seconds_of(work, "memory"), 1e9 / 1.5e11);
  work.layer_kernels = Kernels::kAten;
  work.layer_memory_bytes = 0;
  EXPECT_EQ(seconds_of(work, "layer ops"), -1);  // no such term
  EXPECT_DOUBLE_EQ(seconds_of(work, "memory"), 1e9 / 1.5e11);
  // A probe with the layer cells but no element-wise product of the stream's dtype (another
  // process's JSON): the rest at the one memory rate, the layer bytes counted once.
  work.layer_memory_bytes = 6e8;
  RateProbe without_products = probe;
  without_products.elementwise.clear();
  const DeviceSpeed layers_alone = ProbedSpeed(CpuSpeed(), without_products, "a probe");
  const TimeEstimate alone = EstimateTime(work, layers_alone, none, 0);
  EXPECT_DOUBLE_EQ(TermSeconds(alone, "layer ops"), 6e8 / at_512);
  EXPECT_DOUBLE_EQ(TermSeconds(alone, "memory"), 4e8 / probe.memory_bytes_per_s);
  // A bf16-true fused layer: its own cell.
  work.elementwise_class = MatmulClass::kBf16;
  work.layer_projected_class = MatmulClass::kBf16;
  work.layer_kernels = Kernels::kFused;
  work.elementwise_tensor_bytes = 512 * 512 * 2;
  EXPECT_DOUBLE_EQ(LayerElementwiseRateAt(speed.layer_elementwise, work),
                   512 * LayerElementwiseBytes(widths, 2, 2, Kernels::kFused) /
                       (0.004 - LayerElementwiseLaunches(Kernels::kFused) * probe.launch_seconds));

  nlohmann::json j = nlohmann::json::parse(probe.ToJson().dump());
  ASSERT_EQ(j["layer_elementwise"].size(), 3u);
  StatusOr<RateProbe> back = RateProbe::FromJson(j);
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ(back->ToJson(), probe.ToJson());
  for (const auto& [field, value, problem] :
       {std::tuple{"stream", nlohmann::json("fp16"), "must be fp32 or bf16"},
        std::tuple{"projected", nlohmann::json(16), "must be a string"},
        std::tuple{"kernels", nlohmann::json("triton"), "must be aten or fused"},
        std::tuple{"tokens", nlohmann::json(0), "must be an integer from 1 to 1048576"},
        std::tuple{"inter", nlohmann::json(1.5), "must be an integer from 1 to 1048576"},
        std::tuple{"kv_width", nlohmann::json(nullptr), "must be an integer from 1 to 1048576"},
        std::tuple{"seconds", nlohmann::json(-1), "must be 0 (not measured) or from"}}) {
    nlohmann::json broken = j;
    broken["layer_elementwise"][1][field] = value;
    const std::string message = RateProbe::FromJson(broken).status().message();
    EXPECT_NE(message.find(std::string("'layer_elementwise[1].") + field + "' " + problem),
              std::string::npos)
        << field << ": " << message;
  }
  nlohmann::json on_gpu = j;
  on_gpu["identity"]["device"] = "cuda";
  on_gpu["elementwise"] = nlohmann::json::array();
  EXPECT_NE(
      RateProbe::FromJson(on_gpu).status().message().find("'layer_elementwise' must be empty"),
      std::string::npos)
      << RateProbe::FromJson(on_gpu).status().message();
  nlohmann::json missing = j;
  missing.erase("layer_elementwise");
  EXPECT_NE(
      RateProbe::FromJson(missing).status().message().find("'layer_elementwise' must be a list"),
      std::string::npos);
  missing["version"] = 15;  // before the cells: none
  StatusOr<RateProbe> v15 = RateProbe::FromJson(missing);
  ASSERT_TRUE(v15.ok()) << v15.status().message();
  EXPECT_TRUE(ProbedSpeed(CpuSpeed(), *v15, "a probe").layer_elementwise.empty());
}

}  // namespace
}  // namespace llmctl::estimate
