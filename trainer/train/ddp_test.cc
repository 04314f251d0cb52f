// strategy: ddp as a user runs it: `llm-train --nproc 2` on this CPU (Gloo), checked against one
// process with twice the micro-batch, and its per-rank memory against one device's.
#include "trainer/train/ddp.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "trainer/testing/ranked_demo.h"
#include "trainer/testing/trial_runner.h"
#include "trainer/train/checkpoints.h"

namespace llmctl::trainer {
namespace {

using DemoRun = testing::RankedDemoRun;
using testing::EventsOfType;
using testing::StepLosses;

constexpr int64_t kSteps = 3;

// experiments/demo.yaml for `steps` steps with `sets`, as `ranks` ddp ranks (--nproc) or one
// process; a checkpoint after the last step.
DemoRun RunDemo(const std::string& name, int ranks, const std::vector<std::string>& sets,
                int64_t steps = kSteps, const std::string& extra_flags = "") {
  return testing::RunRankedDemo("ddp", name, ranks, sets, steps, extra_flags);
}

// 2 ranks at micro-batch m against 1 process at 2m (testing/ranked_demo.h says what must agree).
void ExpectSameTraining(const std::string& name, const std::vector<std::string>& one,
                        const std::vector<std::string>& two) {
  testing::ExpectTwoRanksTrainLikeOneProcess("ddp", name, one, two, kSteps);
}

TEST(DdpTest, TwoRanksTrainLikeOneProcessWithTwiceTheMicroBatch) {
  ExpectSameTraining("adamw", {"train.micro_batch_size=4", "train.global_batch_size=4"},
                     {"train.micro_batch_size=2", "train.global_batch_size=4"});
}

// With accumulation (only the last micro-batch communicates), and with SGD, whose update scales
// with the gradient: ranks that summed instead of averaging would take steps twice as long. Small
// buckets put the model's gradients in several, started from the hooks in turn.
TEST(DdpTest, AccumulatedStepsAverageTheGradientsAcrossRanks) {
  const std::vector<std::string> sgd = {"optimizer=sgd", "train.lr=0.5", "train.warmup_steps=0"};
  std::vector<std::string> one = sgd, two = sgd;
  one.insert(one.end(), {"train.micro_batch_size=4", "train.global_batch_size=8"});
  two.insert(two.end(),
             {"train.micro_batch_size=2", "train.global_batch_size=8", "ddp.bucket_size=64KiB"});
  ExpectSameTraining("sgd-accumulation", one, two);
}

// Every rank's memory is one device's at the same micro-batch plus the comm buffers: the buckets,
// which hold one copy of the trainable parameters' gradients, and the slots the ranks sum their
// token counts and losses in. Examples cut to one length give every micro-batch
// the same shape, so the activations are the same bytes on every rank.
TEST(DdpTest, PerRankMemoryIsOneDevicesPlusTheBuckets) {
  const std::vector<std::string> shape = {"data.max_seq_length=24", "data.mask_prompt=false",
                                          "train.micro_batch_size=2"};
  std::vector<std::string> one = shape, two = shape;
  one.push_back("train.global_batch_size=2");
  two.insert(two.end(), {"train.global_batch_size=4", "ddp.bucket_size=64KiB"});
  const DemoRun single = RunDemo("memory-1", 1, one);
  const DemoRun ddp = RunDemo("memory-2", 2, two);
  ASSERT_EQ(single.exit_code, 0) << single.output;
  ASSERT_EQ(ddp.exit_code, 0) << ddp.output;
  const std::vector<nlohmann::json> expected = EventsOfType(single.events[0], "snapshot");
  ASSERT_EQ(expected.size(), static_cast<size_t>(kSteps * 4));
  const uint64_t grads = expected.back()["grads_bytes"];
  ASSERT_GT(grads, 0u);
  const uint64_t comm = grads + DataParallel::kMaxSummedValues * sizeof(double);
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_EQ(EventsOfType(ddp.events[rank], "start").at(0)["comm_bytes"], comm);
    const std::vector<nlohmann::json> snapshots = EventsOfType(ddp.events[rank], "snapshot");
    ASSERT_EQ(snapshots.size(), expected.size());
    for (size_t i = 0; i < expected.size(); ++i) {
      const nlohmann::json& s = snapshots[i];
      const nlohmann::json& e = expected[i];
      const std::string where = "rank " + std::to_string(rank) + ", step " + s["step"].dump() +
                                " " + s["phase"].get<std::string>();
      EXPECT_EQ(s["comm_bytes"], comm) << where;
      EXPECT_EQ(e["comm_bytes"], 0) << where;
      for (const char* same :
           {"params_bytes", "grads_bytes", "optim_device_bytes", "other_bytes"}) {
        EXPECT_EQ(s[same], e[same]) << where << " " << same;
      }
      EXPECT_EQ(s["allocated_bytes"].get<uint64_t>(), e["allocated_bytes"].get<uint64_t>() + comm)
          << where;
    }
  }
}

TEST(DdpTest, ARankWithoutItsPeersSaysHowToStartThem) {
  const DemoRun run =
      RunDemo("no-ranks", 1, {"strategy=ddp", "devices=2", "train.global_batch_size=8"});
  EXPECT_EQ(run.exit_code, 2) << run.output;
  EXPECT_NE(run.output.find("--nproc 2"), std::string::npos) << run.output;
}

}  // namespace
}  // namespace llmctl::trainer
