// The embedded default end to end: the built `llmctl` starts llmctld and llm-agent in a fresh data
// directory, registers the agent, submits an experiment whose data and tokenizer live on "the
// user's machine" (uploaded as input trees), waits for it, reports it as JSON, submits it again
// (nothing left to upload) and stops both daemons. Real processes, real gRPC on unix sockets, real
// SQLite, a real llm-train run of the demo model for two steps.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "common/text.h"
#include "tests/support/shell_command.h"

namespace {

namespace fs = std::filesystem;
using llmctl::ShellWord;
using llmctl::testing::BuildDir;
using llmctl::testing::CommandResult;
using llmctl::testing::SourceDir;
using llmctl::testing::SubmittedExperimentId;

// An experiment file's start: two steps of the demo model on the demo's data and tokenizer, as
// UserDirWithDemoInputs puts them beside the file.
constexpr char kTwoStepDemoRun[] =
    "model: llmctl-demo\n"
    "init: random\n"
    "tokenizer: tokenizer.json\n"
    "data: {path: train.jsonl, max_seq_length: 64}\n"
    "train: {micro_batch_size: 2, max_steps: 2}\n";

class EmbeddedLlmctlTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const fs::path& binary :
         {BuildDir() / "controller" / "llmctld", BuildDir() / "trainer" / "llm-train"}) {
      ASSERT_TRUE(fs::exists(binary)) << binary << " is not built";
    }
    char pattern[] = "/tmp/llmctl-embedded-XXXXXX";
    ASSERT_NE(::mkdtemp(pattern), nullptr);
    home_ = pattern;
    llmctl_home_ = home_;
  }
  void TearDown() override {
    if (home_.empty()) return;
    Llmctl({"daemon", "stop"});  // whatever happened above, no daemon outlives the test
    fs::remove_all(home_);
  }

  // The built llmctl with `args`, each one word of the shell's line whatever it holds (a test's
  // LLMCTL_HOME holds a space, '#' and '%').
  CommandResult Llmctl(const std::vector<std::string>& args) {
    std::string command = "env -u LLMCTL_CONTROLLER " +
                          ShellWord("LLMCTL_HOME=" + llmctl_home_.string()) + " " +
                          ShellWord("XDG_CONFIG_HOME=" + (llmctl_home_ / "config").string()) + " " +
                          ShellWord((BuildDir() / "controller" / "cli" / "llmctl").string());
    for (const std::string& arg : args) command.append(" ").append(ShellWord(arg));
    return llmctl::testing::RunShellCommand(command);
  }

  // The first trial of experiment `id`'s report as JSON; an empty object when llmctl failed.
  nlohmann::json FirstTrial(const std::string& id) {
    CommandResult report = Llmctl({"report", id, "--format", "json"});
    EXPECT_EQ(report.exit_code, 0) << report.out;
    const nlohmann::json json =
        nlohmann::json::parse(report.out, nullptr, /*allow_exceptions=*/false);
    if (!json.is_object() || !json.contains("trials") || json["trials"].empty()) return {};
    return json["trials"][0];
  }

  // Polls the first trial of experiment `id` until `done` says so (false after a minute).
  template <typename Done>
  bool WaitForFirstTrial(const std::string& id, nlohmann::json& trial, Done done) {
    for (int polls = 0; polls < 1200; ++polls) {
      trial = FirstTrial(id);
      if (done(trial)) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return false;
  }

  // home_/user with the demo's data and tokenizer as train.jsonl and tokenizer.json, for a tiny
  // experiment file written beside them.
  fs::path UserDirWithDemoInputs() {
    const fs::path user = home_ / "user";
    fs::create_directories(user);
    fs::copy_file(SourceDir() / "experiments/data/alpaca-demo.jsonl", user / "train.jsonl");
    fs::copy_file(SourceDir() / "experiments/tokenizers/demo/tokenizer.json",
                  user / "tokenizer.json");
    return user;
  }

  fs::path home_;         // the test's directory, removed after it
  fs::path llmctl_home_;  // LLMCTL_HOME: home_ or a directory inside it
};

// gRPC reads a unix: address as a URI: a socket path's space, '#' or '%' reaches the embedded
// daemons only percent-encoded (rpc::GrpcAddress), on the controller's dial of its agent too.
TEST_F(EmbeddedLlmctlTest, AHomeWhosePathHoldsASpaceAndAHashRunsATrial) {
  llmctl_home_ = home_ / "My Drive #1 %41";  // llmctl makes it: its daemons take no one else's
  const fs::path user = UserDirWithDemoInputs();
  std::ofstream(user / "tiny.yaml") << kTwoStepDemoRun
                                    << "trials:\n"
                                       "  - {name: tiny, expect: ok}\n";

  CommandResult submitted = Llmctl({"submit", (user / "tiny.yaml").string(), "--wait"});
  ASSERT_EQ(submitted.exit_code, 0) << submitted.out;
  const nlohmann::json trial = FirstTrial(SubmittedExperimentId(submitted.out));
  EXPECT_EQ(trial.value("outcome", ""), "ok") << trial.dump();
}

TEST_F(EmbeddedLlmctlTest, SubmitWaitReportAndStop) {
  const fs::path user = UserDirWithDemoInputs();
  std::ofstream(user / "tiny.yaml") << kTwoStepDemoRun
                                    << "trials:\n"
                                       "  - name: squeezed\n"
                                       "    set: {device_memory: 6MiB}\n"
                                       "    expect: oom\n"
                                       "  - {name: tiny, expect: ok}\n";

  CommandResult submitted = Llmctl({"submit", (user / "tiny.yaml").string(), "--wait"});
  ASSERT_EQ(submitted.exit_code, 0) << submitted.out;
  const std::string id = SubmittedExperimentId(submitted.out);
  EXPECT_NE(submitted.out.find("2 trees, 2 files, 2 uploaded"), std::string::npos) << submitted.out;
  // --wait exits 0 only when every trial ended as its `expect:` says. The trial predicted to run
  // out of memory is expected to: no warning.
  EXPECT_EQ(submitted.out.find("warning:"), std::string::npos) << submitted.out;

  CommandResult report = Llmctl({"report", id, "--format", "json"});
  ASSERT_EQ(report.exit_code, 0);
  const nlohmann::json json = nlohmann::json::parse(report.out);
  ASSERT_EQ(json["trials"].size(), 2u);
  // The trial that ran out of memory is stored as oom with the snapshot taken when the allocation
  // failed, and the next trial on the same agent still ran.
  const nlohmann::json& squeezed = json["trials"][0];
  EXPECT_EQ(squeezed["name"], "squeezed");
  EXPECT_EQ(squeezed["outcome"], "oom");
  EXPECT_GT(squeezed["at_peak"]["params_bytes"].get<int64_t>(), 0);
  EXPECT_LE(squeezed["at_peak"]["allocated_bytes"].get<int64_t>(), 6 << 20);
  // Each trial was submitted with its predicted memory: the squeezed one's verdict against its
  // 6 MiB, the other's none (a CPU without device_memory).
  EXPECT_EQ(squeezed["prediction"]["verdict"], "oom");
  EXPECT_EQ(squeezed["prediction"]["device_memory_bytes"], 6 << 20);
  EXPECT_TRUE(squeezed["prediction_error"].is_null());
  const nlohmann::json& trial = json["trials"][1];
  EXPECT_EQ(trial["prediction"]["verdict"], "");
  EXPECT_EQ(trial["prediction"]["model_state_bytes"], 16009220);  // llmctl-demo, fp32 AdamW
  // Predicted for full 64-token rows; the demo's examples are shorter, so it peaked lower.
  ASSERT_TRUE(trial["prediction_error"].is_number()) << trial.dump();
  EXPECT_GE(trial["prediction_error"].get<double>(), 0.0);
  EXPECT_EQ(trial["outcome"], "ok");
  EXPECT_EQ(trial["expected"], "ok");
  EXPECT_GT(trial["peak_bytes"].get<int64_t>(), 0);
  EXPECT_GT(trial["at_peak"]["params_bytes"].get<int64_t>(), 0);
  EXPECT_FALSE(trial["per_phase"].empty());
  EXPECT_TRUE(trial["final_loss"].is_number());
  // Memory over time: every snapshot the trainer took, timed from its start, the at-peak one among
  // them; the out-of-memory trial's last one is where the allocation failed.
  ASSERT_EQ(trial["memory_timeline"].size(), 1u);
  const nlohmann::json& timeline = trial["memory_timeline"][0];
  EXPECT_GT(timeline["started_unix_ms"].get<int64_t>(), 0);
  EXPECT_EQ(timeline["device_limit_bytes"], 0) << "a CPU without device_memory";
  ASSERT_FALSE(timeline["snapshots"].empty());
  double previous_ms = 0;
  for (const nlohmann::json& snapshot : timeline["snapshots"]) {
    EXPECT_GE(snapshot["elapsed_ms"].get<double>(), previous_ms) << snapshot.dump();
    previous_ms = snapshot["elapsed_ms"].get<double>();
  }
  EXPECT_NE(std::find(timeline["snapshots"].begin(), timeline["snapshots"].end(), trial["at_peak"]),
            timeline["snapshots"].end());
  ASSERT_EQ(squeezed["memory_timeline"].size(), 1u);
  EXPECT_EQ(squeezed["memory_timeline"][0]["snapshots"].back(), squeezed["at_peak"]);
  EXPECT_EQ(squeezed["at_peak"]["phase"], "oom");

  // The daemons stayed up; the inputs are already there. A trial predicted to run out of memory
  // that does not say it expects to draws a warning, and is submitted all the same.
  std::ofstream(user / "unexpected.yaml") << kTwoStepDemoRun
                                          << "device_memory: 6MiB\n"
                                             "trials:\n"
                                             "  - name: squeezed\n";
  CommandResult again = Llmctl({"submit", (user / "unexpected.yaml").string()});
  ASSERT_EQ(again.exit_code, 0) << again.out;
  EXPECT_NE(again.out.find("2 files, 0 uploaded (0 bytes)"), std::string::npos) << again.out;
  EXPECT_NE(again.out.find("warning: " + (user / "unexpected.yaml").string() +
                           ": trial squeezed is predicted to run out of memory"),
            std::string::npos)
      << again.out;
  EXPECT_NE(again.out.find("(device_memory 6MiB); `llmctl estimate"), std::string::npos)
      << again.out;

  CommandResult stopped = Llmctl({"daemon", "stop"});
  EXPECT_EQ(stopped.exit_code, 0);
  EXPECT_NE(stopped.out.find("llm-agent (pid"), std::string::npos) << stopped.out;
  EXPECT_NE(stopped.out.find("llmctld (pid"), std::string::npos) << stopped.out;
  CommandResult status = Llmctl({"daemon", "status"});
  EXPECT_NE(status.out.find("llmctld: stopped"), std::string::npos) << status.out;
  EXPECT_NE(status.out.find("llm-agent: stopped"), std::string::npos) << status.out;

  // The next command starts them again, and one that needs the node at once finds it connected:
  // `fetch` said "node local is not connected" (and asked whether the controller ran, exit 3)
  // before a start waited for the controller to reach the agent.
  CommandResult fetched = Llmctl({"fetch", id, "tiny", "--to", (user / "fetched").string()});
  EXPECT_EQ(fetched.exit_code, 0) << fetched.out;
  EXPECT_TRUE(fs::exists(user / "fetched" / "events.jsonl"));
}

// BLIP-2 through the whole system: a model directory and an imagefolder of captioned images are
// checked (every image decoded) and uploaded by `llmctl submit`, run by the agent's llm-train, and
// reported with their memory by phase; a broken image is refused at submit, naming it.
TEST_F(EmbeddedLlmctlTest, Blip2CaptionTrialsSubmitRunAndReport) {
  const fs::path user = home_ / "user";
  fs::create_directories(user);
  fs::copy(SourceDir() / "tests/fixtures/blip2/opt-tiny-captioning", user / "blip2",
           fs::copy_options::recursive);
  fs::copy(SourceDir() / "tests/fixtures/blip2/captions", user / "captions",
           fs::copy_options::recursive);
  std::ofstream(user / "blip2.yaml")
      << "model: blip2\n"
         "init: pretrained\n"
         "data: {path: captions, format: imagefolder, max_seq_length: 12}\n"
         "train: {micro_batch_size: 2, max_steps: 2}\n"
         "trials:\n"
         "  - name: squeezed\n"
         "    set: {device_memory: 1MiB}\n"
         "    expect: oom\n"
         "  - {name: frozen-vision, set: {freeze: [vision_model]}, expect: ok}\n";
  CommandResult submitted = Llmctl({"submit", (user / "blip2.yaml").string(), "--wait"});
  ASSERT_EQ(submitted.exit_code, 0) << submitted.out;
  const std::string id = SubmittedExperimentId(submitted.out);
  CommandResult report = Llmctl({"report", id, "--format", "json"});
  ASSERT_EQ(report.exit_code, 0);
  const nlohmann::json json = nlohmann::json::parse(report.out);
  ASSERT_EQ(json["trials"].size(), 2u);
  EXPECT_EQ(json["trials"][0]["outcome"], "oom");
  const nlohmann::json& trial = json["trials"][1];
  EXPECT_EQ(trial["outcome"], "ok") << trial.dump();
  EXPECT_TRUE(trial["final_loss"].is_number());
  EXPECT_GT(trial["at_peak"]["params_bytes"].get<int64_t>(), 0);
  EXPECT_LT(trial["at_peak"]["grads_bytes"].get<int64_t>(),
            trial["at_peak"]["params_bytes"].get<int64_t>())
      << "the frozen vision encoder has no gradients";

  std::ofstream(user / "captions" / "images" / "00002.png", std::ios::trunc) << "not a png";
  CommandResult refused = Llmctl({"submit", (user / "blip2.yaml").string()});
  EXPECT_NE(refused.exit_code, 0);
  EXPECT_NE(refused.out.find("captions/images/00002.png"), std::string::npos) << refused.out;
}

// The multi-GPU lab in miniature (experiments/cpu-multi.yaml, as the README runs it): two ranks per
// data-parallel trial through the agent, each with its own 176 MiB budget. Every trial ends as the
// file expects, the multi-rank ones report each rank, DDP's out-of-memory names the rank, and FSDP
// holds half the weights per rank. On a 112 MiB device FSDP runs out of memory and FSDP with full
// offload fits, its shards, gradients and AdamW state reported as host bytes.
TEST_F(EmbeddedLlmctlTest, CpuMultiLabEndsAsItsFileExpectsWithEveryRanksMemory) {
  CommandResult submitted =
      Llmctl({"submit", (SourceDir() / "experiments/cpu-multi.yaml").string(), "--wait"});
  ASSERT_EQ(submitted.exit_code, 0) << submitted.out;
  const std::string id = SubmittedExperimentId(submitted.out);
  CommandResult report = Llmctl({"report", id, "--format", "json"});
  ASSERT_EQ(report.exit_code, 0) << report.out;
  const nlohmann::json json = nlohmann::json::parse(report.out);
  ASSERT_EQ(json["trials"].size(), 6u);
  std::map<std::string, nlohmann::json> trials;
  for (const nlohmann::json& trial : json["trials"]) trials[trial["name"]] = trial;
  constexpr int64_t kBudget = int64_t{176} << 20;

  const nlohmann::json& one = trials.at("one-device-small-batch");
  EXPECT_FALSE(one.contains("ranks")) << "one process";
  for (const char* name : {"ddp", "fsdp"}) {
    const nlohmann::json& trial = trials.at(name);
    ASSERT_TRUE(trial.contains("ranks")) << name;
    ASSERT_EQ(trial["ranks"].size(), 2u) << name;
    int64_t max_peak = 0;
    for (const nlohmann::json& rank : trial["ranks"]) {
      EXPECT_GT(rank["peak_bytes"].get<int64_t>(), 0) << name;
      EXPECT_LE(rank["peak_bytes"].get<int64_t>(), kBudget) << name;
      max_peak = std::max(max_peak, rank["peak_bytes"].get<int64_t>());
    }
    EXPECT_EQ(trial["max_rank_peak_bytes"], max_peak) << name;
  }
  const nlohmann::json& ddp = trials.at("ddp");
  EXPECT_EQ(ddp["outcome"], "oom");
  EXPECT_NE(ddp["error"].get<std::string>().find(" of 2"), std::string::npos) << ddp["error"];
  // DDP keeps the whole model on every rank; FSDP half of it (the demo's shapes split evenly).
  EXPECT_EQ(ddp["at_peak"]["params_bytes"], one["at_peak"]["params_bytes"]);
  const nlohmann::json& fsdp = trials.at("fsdp");
  EXPECT_EQ(fsdp["outcome"], "ok");
  EXPECT_LE(2 * fsdp["at_peak"]["params_bytes"].get<int64_t>(),
            one["at_peak"]["params_bytes"].get<int64_t>() + 1024)
      << "FSDP's shard is about half the weights, with at most a little padding";
  EXPECT_LT(fsdp["max_rank_peak_bytes"].get<int64_t>(), one["peak_bytes"].get<int64_t>());
  EXPECT_GT(fsdp["tokens_per_second"].get<double>(), 0);

  EXPECT_EQ(trials.at("fsdp-small-device")["outcome"], "oom");
  const nlohmann::json& offload = trials.at("fsdp-offload");
  EXPECT_EQ(offload["outcome"], "ok");
  EXPECT_LE(offload["max_rank_peak_bytes"].get<int64_t>(), int64_t{112} << 20);
  // The shards, their gradients and AdamW's two moments, which the non-offloaded run holds on the
  // device, are on the host: nothing of them on the device.
  EXPECT_EQ(offload["at_peak"]["params_bytes"], 0);
  EXPECT_EQ(offload["at_peak"]["grads_bytes"], 0);
  EXPECT_EQ(offload["at_peak"]["optim_device_bytes"], 0);
  EXPECT_GE(offload["at_peak"]["optim_host_bytes"].get<int64_t>(),
            fsdp["at_peak"]["params_bytes"].get<int64_t>());
}

// "Stop now, keep the progress": `cancel --checkpoint` stops a running trial after a checkpoint of
// its last complete step, `resume` continues it on the same node from there, and the two attempts'
// steps together are the uninterrupted run's, loss for loss (llm-train --resume is exact on CPU).
TEST_F(EmbeddedLlmctlTest, ResumeAfterACheckpointedCancelReproducesTheUninterruptedRun) {
  const fs::path user = UserDirWithDemoInputs();
  const auto write_experiment = [&](int steps) {
    std::ofstream(user / "long.yaml") << "model: llmctl-demo\n"
                                         "init: random\n"
                                         "tokenizer: tokenizer.json\n"
                                         "data: {path: train.jsonl, max_seq_length: 64}\n"
                                         "train: {micro_batch_size: 2, max_steps: "
                                      << steps
                                      << "}\n"
                                         "trials:\n"
                                         "  - {name: long, expect: ok}\n";
  };
  const auto submit = [&](const std::vector<std::string>& flags) {
    std::vector<std::string> args = {"submit", (user / "long.yaml").string()};
    args.insert(args.end(), flags.begin(), flags.end());
    CommandResult submitted = Llmctl(args);
    EXPECT_EQ(submitted.exit_code, 0) << submitted.out;
    return SubmittedExperimentId(submitted.out);
  };

  // Stop a run after at least 3 of its steps. A machine fast enough to finish the run before the
  // stop arrives gets a longer run.
  std::string id;
  int steps = 12;
  for (int tries = 0;; ++tries, steps *= 2) {
    ASSERT_LT(tries, 4) << "every run ended before it could be stopped";
    write_experiment(steps);
    id = submit({});
    nlohmann::json trial;
    const auto running = [](const nlohmann::json& t) {
      return t.value("outcome", "") == "queued" || t.value("outcome", "") == "running";
    };
    ASSERT_TRUE(WaitForFirstTrial(id, trial, [&](const nlohmann::json& t) {
      return !running(t) || t.value("steps", nlohmann::json::array()).size() >= 3;
    })) << trial.dump(2);
    if (trial["outcome"] == "ok") continue;
    CommandResult cancelled = Llmctl({"cancel", id, "--trial", "long", "--checkpoint"});
    ASSERT_EQ(cancelled.exit_code, 0) << cancelled.out;
    ASSERT_TRUE(WaitForFirstTrial(id, trial, [&](const nlohmann::json& t) { return !running(t); }))
        << trial.dump(2);
    if (trial["outcome"] == "ok") continue;  // it ended before the stop arrived
    ASSERT_EQ(trial["outcome"], "cancelled") << trial.dump(2);
    EXPECT_NE(trial["error"].get<std::string>().find("checkpoint after step " +
                                                     std::to_string(trial["steps"].size())),
              std::string::npos)
        << trial["error"];
    break;
  }

  // The same run, uninterrupted.
  const std::string reference_id = submit({"--wait"});
  const nlohmann::json reference = FirstTrial(reference_id);
  ASSERT_EQ(reference["steps"].size(), static_cast<size_t>(steps));

  CommandResult resumed = Llmctl({"resume", id, "long", "--wait"});
  ASSERT_EQ(resumed.exit_code, 0) << resumed.out;
  EXPECT_NE(resumed.out.find("resuming long of experiment " + id + " at step "), std::string::npos)
      << resumed.out;
  const nlohmann::json trial = FirstTrial(id);
  EXPECT_EQ(trial["outcome"], "ok");
  EXPECT_EQ(trial["attempt"], 2);
  EXPECT_EQ(trial["run_attempts"], nlohmann::json({1, 2}));
  ASSERT_EQ(trial["steps"].size(), static_cast<size_t>(steps));
  size_t first_run = 0;
  for (size_t i = 0; i < trial["steps"].size(); ++i) {
    const nlohmann::json& step = trial["steps"][i];
    EXPECT_EQ(step["step"], i);
    if (step["attempt"] == 1) first_run = i + 1;
    EXPECT_EQ(step["attempt"], i < first_run ? 1 : 2) << "step " << i;
    // Exactly: the continuation starts from the checkpoint's weights, optimizer state, data
    // position and generators.
    EXPECT_EQ(step["loss"].get<double>(), reference["steps"][i]["loss"].get<double>())
        << "step " << i;
  }
  EXPECT_GE(first_run, 3u);
  EXPECT_LT(first_run, static_cast<size_t>(steps));
  EXPECT_EQ(trial["final_loss"], reference["final_loss"]);
  EXPECT_NE(resumed.out.find("long: resumed; steps 1-" + std::to_string(first_run) +
                             " in attempt 1, " + std::to_string(first_run + 1) + "-" +
                             std::to_string(steps) + " in attempt 2"),
            std::string::npos)
      << resumed.out;

  // Nothing left to resume now.
  CommandResult again = Llmctl({"resume", id, "long"});
  EXPECT_EQ(again.exit_code, 2) << again.out;
  EXPECT_NE(again.out.find("ended ok: there is nothing left to run"), std::string::npos)
      << again.out;
}

}  // namespace
