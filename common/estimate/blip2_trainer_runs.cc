#include "common/estimate/blip2_trainer_runs.h"

#include <gtest/gtest.h>
#include <sys/resource.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <vector>

#include "common/estimate/blip2_memory.h"

namespace llmctl::estimate::testing {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// One step, a snapshot of every phase, no device budget (so the out-of-memory rows run).
const Sets kOneStep = {{"train.max_steps", "1"}, {"snapshot_every", "1"},   {"device_memory", ""},
                       {"output_dir", ""},       {"checkpoint_every", "0"}, {"profile.steps", "0"}};

// The CPU time of this process's finished children: a run's own cost, however busy the machine.
double ChildrenCpuSeconds() {
  rusage usage{};
  getrusage(RUSAGE_CHILDREN, &usage);
  return static_cast<double>(usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) +
         1e-6 * static_cast<double>(usage.ru_utime.tv_usec + usage.ru_stime.tv_usec);
}

// Every figure of the two estimates.
bool SameModelState(const ModelStateEstimate& a, const ModelStateEstimate& b) {
  return a.world_size == b.world_size && a.parameters_total == b.parameters_total &&
         a.parameters_trainable == b.parameters_trainable && a.params_bytes == b.params_bytes &&
         a.grads_bytes == b.grads_bytes && a.optim_device_bytes == b.optim_device_bytes &&
         a.optim_host_bytes == b.optim_host_bytes && a.comm_bytes == b.comm_bytes &&
         a.fsdp_root_values == b.fsdp_root_values && a.fsdp_layer_values == b.fsdp_layer_values &&
         a.fsdp_root_buffer_bytes == b.fsdp_root_buffer_bytes &&
         a.fsdp_layer_buffer_bytes == b.fsdp_layer_buffer_bytes;
}

// `c` as one micro-batch a step (AtMostMicroBatches) of at most `images` images (0: the case's
// own).
Case OneMicroBatch(const Case& c, const TrialConfig& config, int64_t images) {
  if (images == 0 || config.GetInt("train.micro_batch_size") <= images) {
    return AtMostMicroBatches(c, config, /*micro_batches=*/1);
  }
  Case fewer = c;
  fewer.sets.emplace_back("train.micro_batch_size", std::to_string(images));
  fewer.sets.emplace_back("train.global_batch_size", std::to_string(images * c.nproc));
  return fewer;
}

}  // namespace

fs::path WriteLongCaptions(const fs::path& dir) {
  const fs::path source = SourceDir() + "/experiments/data/captions";
  const fs::path folder = dir / "long-captions";
  fs::create_directories(folder);
  fs::copy(source / "images", folder / "images", fs::copy_options::recursive);
  std::ifstream in(source / "metadata.jsonl");
  std::ofstream out(folder / "metadata.jsonl");
  for (std::string line; std::getline(in, line);) {
    json row = json::parse(line);
    const std::string caption = row["text"];
    std::string text = caption;
    for (int i = 1; i < 8; ++i) text += " and " + caption;
    row["text"] = text;
    out << row.dump() << "\n";
  }
  return folder;
}

StatusOr<Blip2Case> LoadBlip2Case(const Case& c, const Sets& common) {
  ASSIGN_OR_RETURN(TrialConfig config, LoadCaseConfig(c, common));
  ASSIGN_OR_RETURN(std::optional<Blip2Config> model, ResolveBlip2Model(config.GetString("model")));
  if (!model.has_value()) {
    return InvalidArgumentError(Describe(c) + ": " + config.GetString("model") +
                                " is not a BLIP-2 model");
  }
  return Blip2Case{.config = std::move(config), .model = std::move(*model)};
}

namespace {

// What ExpectBlip2StatesExact runs for a case and checks it against.
struct StatePlan {
  Case c;                  // the case whose estimate is checked
  Blip2Case loaded;        // its configuration (with kOneStep) and model
  Case run_case;           // what runs: OneMicroBatch's
  TrialConfig run_config;  // run_case's configuration
};

// `c`'s plan, appended to `plans`.
void PlanState(const Case& c, int64_t images, std::vector<StatePlan>& plans) {
  SCOPED_TRACE(Describe(c));
  StatusOr<Blip2Case> loaded = LoadBlip2Case(c, kOneStep);
  ASSERT_TRUE(loaded.ok()) << loaded.status().message();
  const Case run_case = OneMicroBatch(c, loaded->config, images);
  StatusOr<TrialConfig> run_config = LoadCaseConfig(run_case, kOneStep);
  ASSERT_TRUE(run_config.ok()) << run_config.status().message();
  plans.push_back({c, std::move(*loaded), run_case, std::move(*run_config)});
}

// The run's model state on every rank equals the plan's estimate, which must be the run's own too.
void CheckState(const StatePlan& plan, const TrainerRun& run) {
  SCOPED_TRACE(Describe(plan.c));
  ASSERT_EQ(run.exit_code, 0) << run.command << " exited with " << run.exit_code << "\n"
                              << run.output;
  ExpectModelStateExact(
      plan.c,
      [&](int64_t rank) -> StatusOr<ModelStateEstimate> {
        ASSIGN_OR_RETURN(ModelStateEstimate estimate,
                         EstimateBlip2ModelState(plan.loaded.config, plan.loaded.model, rank));
        ASSIGN_OR_RETURN(ModelStateEstimate ran,
                         EstimateBlip2ModelState(plan.run_config, plan.loaded.model, rank));
        if (!SameModelState(ran, estimate)) {
          return InternalError("the estimate of " + Describe(plan.run_case) + " is not the case's");
        }
        return estimate;
      },
      run.ranks);
}

}  // namespace

void ExpectBlip2StatesExact(const std::vector<Case>& cases, const fs::path& dir, int first_index,
                            int64_t images) {
  std::vector<StatePlan> plans;
  for (const Case& c : cases) {
    PlanState(c, images, plans);
    if (::testing::Test::HasFatalFailure()) return;
  }
  std::vector<Case> run_cases;
  for (const StatePlan& plan : plans) run_cases.push_back(plan.run_case);
  const auto start = std::chrono::steady_clock::now();
  const double cpu_before = ChildrenCpuSeconds();
  const std::vector<TrainerRun> runs = RunLlmTrainCases(run_cases, kOneStep, dir, first_index);
  const std::chrono::duration<double> wall = std::chrono::steady_clock::now() - start;
  std::printf("%zu runs: %.1f s, %.1f CPU s\n", runs.size(), wall.count(),
              ChildrenCpuSeconds() - cpu_before);
  ASSERT_EQ(runs.size(), plans.size());
  for (size_t i = 0; i < runs.size(); ++i) CheckState(plans[i], runs[i]);
}

}  // namespace llmctl::estimate::testing
