// llmctl's commands against an in-process fake Controller on a unix socket: submit and its uploads,
// watch, report, cancel, resume, fetch, and the controller's address and token
// (node_commands_test.cc: targets, nodes and the estimate's nodes).
#include "controller/cli/commands.h"

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <sstream>

#include "common/digest/digest.h"
#include "controller/cli/client.h"
#include "controller/cli/commands_test_support.h"
#include "controller/cli/input_tree.h"
#include "controller/cli/inputs.h"
#include "controller/cli/offline_cli_test.h"
#include "llmctl/v1/controller.grpc.pb.h"

namespace llmctl::cli {
namespace {

namespace fs = std::filesystem;

TEST_F(CommandsTest, SubmitUploadsOnlyMissingBlobsInChunksAndSendsTheTrees) {
  const std::string data = Records(2 * kBlobChunkBytes + 5);  // three chunks
  WriteGoodInputs(data);
  Write("lab/tok/special_tokens_map.json", "{}");
  Write("lab/tok/notes.txt", "{}");  // same bytes: one blob
  fake_.present_.insert(digest::Sha256Hex("{}"));
  fake_.present_.insert(digest::Sha256Hex(Tokenizer()));
  const std::string file = WriteExperiment();

  ASSERT_EQ(Run({"submit", file}), kExitOk) << err_.str();
  EXPECT_EQ(out_.str(), "42\n");

  std::lock_guard lock(fake_.mutex_);
  EXPECT_EQ(fake_.asked_.size(), 3u);  // each distinct blob once
  ASSERT_EQ(fake_.uploaded_.size(), 1u);
  EXPECT_EQ(fake_.uploaded_.begin()->first, digest::Sha256Hex(data));
  EXPECT_EQ(fake_.uploaded_.begin()->second, data);
  EXPECT_EQ(fake_.upload_chunk_sizes_.begin()->second,
            (std::vector<size_t>{kBlobChunkBytes, kBlobChunkBytes, 5}));

  ASSERT_TRUE(fake_.submitted_.has_value());
  const v1::SubmitRequest& request = *fake_.submitted_;
  EXPECT_EQ(request.filename(), file);
  EXPECT_EQ(request.yaml_text().rfind("model: llmctl-demo\n", 0), 0u);
  // Keyed by the path as written; the preset and the path on the node are not.
  ASSERT_EQ(request.inputs_size(), 2);
  const v1::InputTree& data_tree = request.inputs().at("data/train.jsonl");
  EXPECT_TRUE(data_tree.is_file());
  EXPECT_EQ(data_tree.files(0).path(), "train.jsonl");
  EXPECT_EQ(data_tree.files(0).size(), static_cast<int64_t>(data.size()));
  const v1::InputTree& tokenizer_tree = request.inputs().at("tok");
  EXPECT_FALSE(tokenizer_tree.is_file());
  EXPECT_EQ(tokenizer_tree.files_size(), 3);
  EXPECT_EQ(tokenizer_tree.digest(), InputTreeDigest(tokenizer_tree));
}

// --trial: the request names the trials to start; one the file lacks is invalid input, and
// nothing is sent.
TEST_F(CommandsTest, SubmitTrialSendsOnlyTheNamedTrialsAndRefusesAnUnknownOne) {
  WriteGoodInputs(Records(4096));
  Write("lab/tok/special_tokens_map.json", "{}");
  const std::string file = WriteExperiment();
  EXPECT_EQ(Run({"submit", file, "--trial", "nope"}), kExitInvalidInput);
  EXPECT_NE(err_.str().find("no trial named 'nope' (its trials: a, b)"), std::string::npos)
      << err_.str();
  {
    std::lock_guard lock(fake_.mutex_);
    EXPECT_FALSE(fake_.submitted_.has_value());
  }
  ASSERT_EQ(Run({"submit", file, "--trial", "a"}), kExitOk) << err_.str();
  std::lock_guard lock(fake_.mutex_);
  ASSERT_TRUE(fake_.submitted_.has_value());
  EXPECT_EQ(std::vector<std::string>(fake_.submitted_->only_trials().begin(),
                                     fake_.submitted_->only_trials().end()),
            std::vector<std::string>{"a"});
}

// The controller's words in submit's lines (the experiment's name it answers, why its measured
// runs could not be read) reach the terminal on one line, without an escape sequence.
TEST_F(CommandsTest, SubmitPrintsTheControllersWordsOnOneLine) {
  WriteGoodInputs(Records(4096));
  Write("lab/tok/special_tokens_map.json", "{}");
  const std::string file = WriteExperiment();
  {
    std::lock_guard lock(fake_.mutex_);
    fake_.submit_name_ = "lab\x1b]0;T\x07\nFORGED";
    fake_.timed_runs_error_ =
        "down\x1b[2J\r\nFORGED \xc2\x9b"
        "31m";
  }
  ASSERT_EQ(Run({"submit", file}), kExitOk) << err_.str();
  EXPECT_EQ(err_.str().find_first_of("\x1b\x07\r"), std::string::npos) << err_.str();
  EXPECT_EQ(err_.str().find("\xc2\x9b"), std::string::npos) << err_.str();
  EXPECT_NE(err_.str().find("submitted lab ]0;T  FORGED (1 trial); "), std::string::npos)
      << err_.str();
  EXPECT_NE(err_.str().find(": down [2J  FORGED  31m\n"), std::string::npos) << err_.str();

  // No node measured its rates (an agent under LLMCTL_RATE_PROBE=off): the predicted time says it
  // is at the data sheet's, which the report shows.
  std::lock_guard lock(fake_.mutex_);
  ASSERT_TRUE(fake_.submitted_.has_value());
  ASSERT_EQ(fake_.submitted_->predictions().count("a"), 1u);
  const v1::TrialPrediction& predicted = fake_.submitted_->predictions().at("a");
  ASSERT_GT(predicted.step_seconds(), 0);
  EXPECT_TRUE(predicted.calibration().ends_with("; the data sheet's nominal rates"))
      << predicted.calibration();
}

// A cuda trial whose predicted peak lies within the caching allocator's slack of its budget is
// stored as tight and draws a warning, and is submitted all the same; one that expects to run out
// of memory draws none.
TEST_F(CommandsTest, SubmitWarnsOfATightTrialAndStoresItsVerdict) {
  WriteGoodInputs(Records(4096));
  const std::string file = (dir_ / "lab" / "gpu.yaml").string();
  auto write = [&](const std::string& budget) {
    Write("lab/gpu.yaml",
          "model: llmctl-demo\ninit: random\ntokenizer: tok\ndata: {path: data/train.jsonl}\n"
          "device: cuda\ndevice_memory: " +
              budget + "\ntrials:\n  - {name: near, expect: ok}\n  - {name: meant, expect: oom}\n");
  };
  write("80GiB");
  ASSERT_EQ(Run({"estimate", file, "--format", "json"}), kExitOk) << err_.str();
  const uint64_t peak = nlohmann::json::parse(out_.str())["trials"][0]["peak_bytes"];
  write(std::to_string(peak + peak / 50));  // 2% above the peak: within the 5% slack

  ASSERT_EQ(Run({"submit", file}), kExitOk) << err_.str();
  EXPECT_NE(err_.str().find("warning: " + file + ": trial near may run out of memory: its peak "),
            std::string::npos)
      << err_.str();
  EXPECT_EQ(err_.str().find("trial meant may run out"), std::string::npos) << err_.str();
  std::lock_guard lock(fake_.mutex_);
  ASSERT_TRUE(fake_.submitted_.has_value());
  EXPECT_EQ(fake_.submitted_->predictions().at("near").verdict(), "tight");
  EXPECT_EQ(fake_.submitted_->predictions().at("meant").verdict(), "tight");
}

TEST_F(CommandsTest, AnUploadGetsTimeForItsSizeAtTheMinimumRate) {
  // 2 MiB at 1 KiB/s: 2048 s on top of the 60 s call deadline.
  const std::string data = Records(2 * kBlobChunkBytes);
  WriteGoodInputs(data);
  Write("lab/tok/special_tokens_map.json", "{}");
  env_["LLMCTL_MIN_TRANSFER_RATE"] = "1KiB";
  ASSERT_EQ(Run({"submit", WriteExperiment()}), kExitOk) << err_.str();

  std::lock_guard lock(fake_.mutex_);
  ASSERT_TRUE(fake_.upload_time_left_.contains(digest::Sha256Hex(data)));
  // The margin only absorbs the time between the call's start and its arrival.
  EXPECT_GT(fake_.upload_time_left_.at(digest::Sha256Hex(data)), std::chrono::seconds(2000));
  // A small blob gets about the call deadline.
  EXPECT_LT(fake_.upload_time_left_.at(digest::Sha256Hex("{}")),
            kCallDeadline + std::chrono::seconds(1));
}

TEST_F(CommandsTest, ABadMinimumTransferRateIsInvalidInputAndSendsNothing) {
  WriteGoodInputs(Records(4096));
  env_["LLMCTL_MIN_TRANSFER_RATE"] = "0";
  EXPECT_EQ(Run({"submit", WriteExperiment()}), kExitInvalidInput);
  EXPECT_NE(err_.str().find("LLMCTL_MIN_TRANSFER_RATE: expected a rate per second above 0"),
            std::string::npos)
      << err_.str();
  std::lock_guard lock(fake_.mutex_);
  EXPECT_EQ(fake_.calls_, 0);
}

// Inputs whose trees the controller could not receive in one SubmitRequest (over 4 MiB: here
// 1,600 files with 2.8 KB paths) are refused before anything is asked, uploaded or submitted.
TEST_F(CommandsTest, ASubmitTooLargeForTheControllerSendsNothing) {
  WriteGoodInputs(Records(4096));
  Write("lab/tok/special_tokens_map.json", "{}");
  fs::path deep = "lab/tok";
  for (int i = 0; i < 14; ++i) deep /= std::string(200, static_cast<char>('a' + i));
  for (int i = 0; i < 1600; ++i)
    Write(deep / std::string("f").append(std::to_string(i)).append(".json"), "{}");
  EXPECT_EQ(Run({"submit", WriteExperiment()}), kExitInvalidInput);
  EXPECT_NE(err_.str().find(" input files in 2 trees, over the controller's limit of 4194304 "
                            "bytes (4 MiB) per message; nothing was uploaded or provisioned"),
            std::string::npos)
      << err_.str();
  EXPECT_NE(err_.str().find("bytes for its 1603 input files"), std::string::npos) << err_.str();
  std::lock_guard lock(fake_.mutex_);
  EXPECT_EQ(fake_.calls_, 0);
  EXPECT_FALSE(fake_.submitted_.has_value());
}

TEST_F(CommandsTest, InvalidFileExitsTwoAndSendsNothing) {
  Write("bad.yaml", "model: llmctl-demo\ntrain: {micro_batch_sise: 4}\n");
  EXPECT_EQ(Run({"submit", (dir_ / "bad.yaml").string()}), kExitInvalidInput);
  EXPECT_NE(err_.str().find("bad.yaml:2:9: unknown key 'train.micro_batch_sise' (did you mean "
                            "'train.micro_batch_size'?)"),
            std::string::npos)
      << err_.str();
  EXPECT_EQ(out_.str(), "");

  EXPECT_EQ(Run({"submit", (dir_ / "missing.yaml").string()}), kExitInvalidInput);
  EXPECT_EQ(Run({"submit"}), kExitInvalidInput);
  EXPECT_EQ(Run({"report", "--format", "pdf"}), kExitInvalidInput);
  EXPECT_EQ(Run({"cancel", "-3"}), kExitInvalidInput);
  std::lock_guard lock(fake_.mutex_);
  EXPECT_EQ(fake_.calls_, 0);
}

TEST_F(CommandsTest, HelpExitsZero) {
  EXPECT_EQ(Run({"--help"}), kExitOk);
  EXPECT_NE(out_.str().find("Exit codes:"), std::string::npos);
  EXPECT_EQ(Run({"report", "--help"}), kExitOk);
  EXPECT_NE(out_.str().find("--format"), std::string::npos);
}

v1::ReportResponse OneTrialReport(const std::string& outcome, const std::string& expected) {
  v1::ReportResponse report;
  report.set_experiment_id(42);
  report.set_name("lab");
  v1::TrialReport* trial = report.add_trials();
  trial->set_name("a");
  trial->set_outcome(outcome);
  trial->set_expected(expected);
  trial->set_train_seconds(2.5);
  trial->set_tokens_per_second(1000);
  trial->set_peak_bytes(100 << 20);
  trial->set_final_loss(2.0);
  v1::MemorySnapshot* snap = trial->mutable_at_peak();
  snap->set_phase("phase1_after_fwd");
  snap->set_params_bytes(10 << 20);
  snap->set_allocated_bytes(90 << 20);
  trial->add_per_phase()->CopyFrom(*snap);
  return report;
}

TEST_F(CommandsTest, ReportJsonShape) {
  fake_.report_ = OneTrialReport("ok", "ok");
  ASSERT_EQ(Run({"report", "42", "--format", "json"}), kExitOk) << err_.str();
  const nlohmann::json json = nlohmann::json::parse(out_.str());
  ASSERT_EQ(json["trials"].size(), 1u);
  const nlohmann::json& trial = json["trials"][0];
  EXPECT_EQ(trial["name"], "a");
  EXPECT_EQ(trial["outcome"], "ok");
  EXPECT_EQ(trial["expected"], "ok");
  EXPECT_EQ(trial["train_seconds"], 2.5);
  EXPECT_EQ(trial["tokens_per_second"], 1000.0);
  EXPECT_EQ(trial["peak_bytes"], 100 << 20);
  EXPECT_EQ(trial["final_loss"], 2.0);
  EXPECT_EQ(trial["at_peak"]["params_bytes"], 10 << 20);
  EXPECT_EQ(trial["at_peak"]["allocated_bytes"], 90 << 20);
  EXPECT_EQ(trial["per_phase"].size(), 1u);

  EXPECT_EQ(Run({"report", "9"}), kExitInvalidInput);  // NOT_FOUND from the controller
  EXPECT_NE(err_.str().find("no experiment 9"), std::string::npos);
}

TEST_F(CommandsTest, ReportOutputWritesTheFile) {
  fake_.report_ = OneTrialReport("ok", "ok");
  const fs::path output = dir_ / "report.html";
  ASSERT_EQ(Run({"report", "--format", "html", "--output", output.string()}), kExitOk);
  EXPECT_EQ(out_.str(), "");
  std::ifstream in(output);
  std::stringstream html;
  html << in.rdbuf();
  EXPECT_EQ(html.str().rfind("<!DOCTYPE html>", 0), 0u);
}

// What a report killed mid-write (Ctrl-C, kill -9) left beside its --output (report.html.tmp.PID.N)
// stayed for good: the next report to that file removes it, and leaves a running writer's alone.
TEST_F(CommandsTest, AReportOutputRemovesWhatAnEndedWriteLeftBesideIt) {
  fake_.report_ = OneTrialReport("ok", "ok");
  const fs::path output = dir_ / "report.html";
  const fs::path ended =
      dir_ / ("report.html.tmp." + std::to_string(testing::PidOfAnEndedProcess()) + ".0");
  const fs::path running = dir_ / ("report.html.tmp." + std::to_string(::getpid()) + ".9999");
  std::ofstream(ended) << "half a report";
  std::ofstream(running) << "a report being written";
  ASSERT_EQ(Run({"report", "--format", "html", "--output", output.string()}), kExitOk)
      << err_.str();
  EXPECT_FALSE(fs::exists(ended));
  EXPECT_TRUE(fs::exists(running));
  EXPECT_TRUE(fs::exists(output));
}

// A report that cannot be written (here a missing directory; a full disk says "No space left on
// device" alike) fails with the file's error and exit 1, not as an unreachable controller: it
// exited 3 and asked whether the controller was running.
TEST_F(CommandsTest, AReportOutputThatCannotBeWrittenIsNotTheControllersFailure) {
  fake_.report_ = OneTrialReport("ok", "ok");
  const std::string output = (dir_ / "missing" / "report.csv").string();
  EXPECT_EQ(Run({"report", "42", "--output", output}), kExitFailed);
  EXPECT_NE(err_.str().find("--output " + output + ": cannot create " + output), std::string::npos)
      << err_.str();
  EXPECT_NE(err_.str().find("No such file or directory"), std::string::npos) << err_.str();
  EXPECT_EQ(err_.str().find("running?"), std::string::npos) << err_.str();

  // A directory is a wrong flag (exit 2), where it failed the write once the report had come.
  EXPECT_EQ(Run({"report", "42", "--output", dir_.string()}), kExitInvalidInput);
  EXPECT_EQ(err_.str(), "llmctl: --output " + dir_.string() +
                            " is a directory; name a file to write the report to\n");
}

TEST_F(CommandsTest, SubmitWaitFollowsThenExitsOneWhenAnOutcomeDiffers) {
  WriteGoodInputs(Records(4096));
  v1::ExperimentStatus running;
  running.set_id(42);
  running.set_state("running");
  v1::TrialStatus* trial = running.add_trials();
  trial->set_name("a");
  trial->set_state("running");
  trial->set_step(1);
  trial->set_total_steps(2);
  v1::ExperimentStatus ended = running;
  ended.set_state("ended");
  ended.mutable_trials(0)->set_state("oom");
  fake_.watch_ = {running, ended};
  fake_.report_ = OneTrialReport("oom", "ok");

  EXPECT_EQ(Run({"submit", WriteExperiment(), "--wait"}), kExitFailed) << err_.str();
  const std::string out = out_.str();
  EXPECT_EQ(out.rfind("42\n", 0), 0u);
  EXPECT_NE(out.find("a      running    ["), std::string::npos) << out;
  EXPECT_NE(out.find("a      oom        ["), std::string::npos) << out;
  EXPECT_NE(out.find("oom (expected ok)"), std::string::npos) << out;

  fake_.report_ = OneTrialReport("ok", "ok");
  EXPECT_EQ(Run({"submit", WriteExperiment(), "--wait"}), kExitOk) << err_.str();
}

// The controller's NotFound is said as it is: watch without an id said "watching experiment 0: no
// experiment has been submitted yet", and watch 99 "watching experiment 99: no experiment 99".
TEST_F(CommandsTest, WatchOfNoExperimentSaysSoOnce) {
  fake_.watch_end_ =
      grpc::Status(grpc::StatusCode::NOT_FOUND, "no experiment has been submitted yet");
  EXPECT_EQ(Run({"watch"}), kExitInvalidInput);
  EXPECT_EQ(err_.str(), "llmctl: no experiment has been submitted yet\n");
}

// Ctrl-C ends watch as it ends submit --wait: saying that the experiment goes on running, exit 130,
// where watch ended silently.
TEST_F(CommandsTest, CtrlCDuringWatchSaysTheExperimentGoesOnRunning) {
  // A fresh process that sets its fake controller up itself, not a fork of the one whose gRPC
  // threads serve it.
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  v1::ExperimentStatus running;
  running.set_id(42);
  running.set_state("running");
  fake_.watch_ = {running};
  fake_.interrupt_watch_ = true;
  EXPECT_EXIT(Run({"watch", "42"}), ::testing::ExitedWithCode(130),
              "llmctl: interrupted; experiment 42 goes on running: `llmctl watch 42` follows it "
              "again, `llmctl cancel 42` cancels it");
  EXPECT_EXIT(Run({"watch"}), ::testing::ExitedWithCode(130),
              "llmctl: interrupted; the experiment goes on running: `llmctl watch ID` follows it "
              "again, `llmctl cancel ID` cancels it");
}

TEST_F(CommandsTest, UnreachableControllerExitsThree) {
  EXPECT_EQ(Run({"report", "1"}, "unix:" + (dir_ / "nobody.sock").string()), kExitUnreachable);
  EXPECT_NE(err_.str().find("is the controller at unix:"), std::string::npos) << err_.str();

  // submit says so once, where its predictions first noted that they went without the measured
  // runs and the nodes' rates, then the upload failed.
  WriteGoodInputs(Records(4096));
  EXPECT_EQ(Run({"submit", WriteExperiment()}, "unix:" + (dir_ / "nobody.sock").string()),
            kExitUnreachable);
  EXPECT_EQ(err_.str().find("note:"), std::string::npos) << err_.str();
  EXPECT_EQ(err_.str().find("llmctl: "), 0u) << err_.str();
  EXPECT_NE(err_.str().find("is the controller at unix:"), std::string::npos) << err_.str();
}

TEST_F(CommandsTest, ATcpControllerIsCalledWithTheTokenFromTheTokenFileAndNeverWithout) {
  FakeController tcp_fake;
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&tcp_fake);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  ASSERT_NE(server, nullptr);
  const std::string target = "127.0.0.1:" + std::to_string(port);

  EXPECT_EQ(Run({"nodes"}, target), kExitInvalidInput);
  EXPECT_NE(err_.str().find("the controller at " + target +
                            " (from LLMCTL_CONTROLLER) is on TCP and takes calls only with its "
                            "API token: set LLMCTL_CONTROLLER_TOKEN_FILE"),
            std::string::npos)
      << err_.str();

  const fs::path token = dir_ / "api.token";
  Write("api.token", "s3cret-token\n");
  fs::permissions(token, fs::perms::owner_read | fs::perms::owner_write);
  env_["LLMCTL_CONTROLLER_TOKEN_FILE"] = token.string();
  EXPECT_EQ(Run({"nodes"}, target), kExitOk) << err_.str();
  {
    std::lock_guard lock(tcp_fake.mutex_);
    EXPECT_EQ(tcp_fake.authorization_, "Bearer s3cret-token");
  }

  // A token file others may read is invalid input, as a missing one is: the user's to fix, its
  // chmod named, and nothing sent.
  const int calls = [&tcp_fake] {
    std::lock_guard lock(tcp_fake.mutex_);
    return tcp_fake.calls_;
  }();
  fs::permissions(token, fs::perms::group_read | fs::perms::others_read, fs::perm_options::add);
  EXPECT_EQ(Run({"nodes"}, target), kExitInvalidInput);
  EXPECT_NE(err_.str().find("token file " + token.string() + " may be read by others; chmod 600"),
            std::string::npos)
      << err_.str();
  env_["LLMCTL_CONTROLLER_TOKEN_FILE"] = (dir_ / "none").string();
  EXPECT_EQ(Run({"nodes"}, target), kExitInvalidInput);
  {
    std::lock_guard lock(tcp_fake.mutex_);
    EXPECT_EQ(tcp_fake.calls_, calls);
  }
  server->Shutdown();
}

TEST_F(CommandsTest, BadControllerAddressIsInvalidInput) {
  EXPECT_EQ(Run({"nodes"}, "localhost"), kExitInvalidInput);
  EXPECT_NE(err_.str().find("LLMCTL_CONTROLLER: controller address 'localhost'"),
            std::string::npos);
}

TEST_F(CommandsTest, CancelNamesWhatWasCancelled) {
  ASSERT_EQ(Run({"cancel", "42", "--trial", "b"}), kExitOk);
  EXPECT_EQ(out_.str(), "cancelled b\n");
}

// A trial named on the command line is echoed on one line when nothing was cancelled.
TEST_F(CommandsTest, NothingToCancelEchoesTheTrialOnOneLine) {
  ASSERT_EQ(Run({"cancel", "42", "--trial", "ended\x1b]0;T\x07\nx"}), kExitOk);
  EXPECT_EQ(out_.str(), "nothing to cancel: ended ]0;T  x had already ended\n");
}

TEST_F(CommandsTest, CancelWithACheckpointAsksForOneAndSaysHowToGoOn) {
  ASSERT_EQ(Run({"cancel", "42", "--trial", "b", "--checkpoint"}), kExitOk);
  EXPECT_TRUE(fake_.cancel_checkpoint_);
  EXPECT_NE(out_.str().find("cancelled b\n"), std::string::npos) << out_.str();
  EXPECT_NE(out_.str().find("`llmctl resume 42 TRIAL` continues"), std::string::npos) << out_.str();
}

TEST_F(CommandsTest, ResumeSaysWhereTheTrialContinuesOrWhyItCannot) {
  ASSERT_EQ(Run({"resume", "42", "b"}), kExitOk);
  EXPECT_EQ(out_.str(),
            "resuming b of experiment 42 at step 4 from attempt 1's checkpoint /ckpt/step-3 on "
            "node n1\n");
  out_.str("");
  ASSERT_EQ(Run({"resume", "42", "copied"}), kExitOk);
  EXPECT_EQ(out_.str(),
            "resuming copied of experiment 42 at step 4 from attempt 1's checkpoint /ckpt/step-3 "
            "on node n1 (the controller has a copy: any node that can run it may continue it)\n");
  EXPECT_EQ(Run({"resume", "42", "running"}), kExitInvalidInput);
  EXPECT_EQ(err_.str(),
            "llmctl: cannot resume: trial 'running' is running; only a trial that has ended can "
            "be resumed\n");
  EXPECT_EQ(Run({"resume", "42", "nope"}), kExitInvalidInput);
  EXPECT_NE(err_.str().find("has no trial 'nope'"), std::string::npos) << err_.str();
  EXPECT_EQ(Run({"resume", "42"}), kExitInvalidInput);
  EXPECT_EQ(Run({"resume", "0", "b"}), kExitInvalidInput);
}

// A local file the disk cannot read (EIO; here config.yaml is /proc/self/mem, whose address 0
// nothing maps) is this machine's failure, exit 1 naming the file: its Unavailable made llmctl
// exit 3 as if the controller could not be reached.
TEST_F(CommandsTest, AConfigFileTheDiskCannotReadIsNotTheControllersFailure) {
  const std::filesystem::path config = dir_ / "config" / "llmctl" / "config.yaml";
  std::filesystem::create_directories(config.parent_path());
  std::filesystem::create_symlink("/proc/self/mem", config);
  env_["XDG_CONFIG_HOME"] = (dir_ / "config").string();
  EXPECT_EQ(Run({"status"}, "localhost:1"), kExitFailed);
  EXPECT_EQ(err_.str(), "llmctl: cannot read " + config.string() + ": Input/output error\n");
}

// A trial named '-lead' reads as a flag CLI11 does not know, and the trial's name as missing: the
// refusal says to put -- before it, which every command's parser takes.
TEST_F(CommandsTest, AValueThatStartsWithADashIsToldToFollowTwoDashes) {
  EXPECT_EQ(Run({"fetch", "1", "-lead"}), kExitInvalidInput);
  EXPECT_NE(err_.str().find("TRIAL is required"), std::string::npos) << err_.str();
  EXPECT_NE(err_.str().find("llmctl: if '-lead' is the TRIAL, not a flag, put -- before it "
                            "(-- -lead)"),
            std::string::npos)
      << err_.str();
  // After -- it is the value: here estimate's FILE, which is not there.
  EXPECT_EQ(Run({"estimate", "--", "-missing.yaml"}), kExitInvalidInput);
  EXPECT_NE(err_.str().find("cannot open -missing.yaml: No such file"), std::string::npos)
      << err_.str();
  EXPECT_EQ(err_.str().find("put --"), std::string::npos) << err_.str();
  // An unknown flag where no name is missing, or where a number is (an id is never negative), is
  // only refused.
  EXPECT_EQ(Run({"fetch", "1", "lead", "-x"}), kExitInvalidInput);
  EXPECT_EQ(err_.str().find("put --"), std::string::npos) << err_.str();
  EXPECT_EQ(Run({"cancel", "-3"}), kExitInvalidInput);
  EXPECT_EQ(err_.str().find("put --"), std::string::npos) << err_.str();
}

// CLI11's refusal quotes the argument it refused: an escape in it (\e[2J clears the screen,
// \e]0;...\a retitles the window) reaches the terminal as a space, and an id that is not one is
// said to be so, not "not in range 0.000000 to" a 309-digit number.
TEST_F(CommandsTest, ARefusedArgumentIsShownWithoutItsEscapes) {
  EXPECT_EQ(Run({"nodes", "\x1b[2J\x1b]0;pwned\a"}), kExitInvalidInput);
  EXPECT_EQ(err_.str().find('\x1b'), std::string::npos) << err_.str();
  EXPECT_EQ(err_.str().find('\a'), std::string::npos) << err_.str();
  EXPECT_NE(err_.str().find(" [2J ]0;pwned "), std::string::npos) << err_.str();

  for (const char* id : {"\x1b[2J", "1.5", "99999999999999999999"}) {
    EXPECT_EQ(Run({"report", id}), kExitInvalidInput) << id;
    EXPECT_EQ(err_.str().find('\x1b'), std::string::npos) << err_.str();
    EXPECT_NE(err_.str().find("is not an experiment id (a whole number from 0)"), std::string::npos)
        << err_.str();
  }
  EXPECT_EQ(Run({"cancel", "0"}), kExitInvalidInput);
  EXPECT_NE(err_.str().find("ID: '0' is not an experiment id (a whole number from 1)"),
            std::string::npos)
      << err_.str();
}

// `llmctl lease ...` is controller/openstack's command with the words after "lease" and our
// environment: here none of the OS_* variables, so it refuses before any network call.
TEST_F(CommandsTest, LeaseHandsItsWordsAndEnvironmentToTheLeaseCommands) {
  EXPECT_EQ(Run({"lease", "list"}), kExitInvalidInput);
  EXPECT_NE(err_.str().find("OS_AUTH_URL is not set"), std::string::npos) << err_.str();
}

TEST_F(CommandsTest, NodeHandsItsWordsAndEnvironmentToTheNodeCommands) {
  EXPECT_EQ(Run({"node", "list"}), kExitInvalidInput);
  EXPECT_NE(err_.str().find("OS_AUTH_URL is not set"), std::string::npos) << err_.str();
  EXPECT_EQ(Run({"node", "up"}), kExitInvalidInput);
  EXPECT_NE(err_.str().find("--lease is required"), std::string::npos) << err_.str();
}

std::vector<v1::ArtifactChunk> ArtifactChunks(const std::string& path, const std::string& bytes,
                                              const std::string& sha256) {
  v1::ArtifactChunk first, last;
  first.set_path(path);
  first.set_size(static_cast<int64_t>(bytes.size()));
  first.set_data(bytes.substr(0, 3));
  last.set_data(bytes.substr(3));
  last.set_sha256(sha256);
  last.set_last(true);
  return {first, last};
}

TEST_F(CommandsTest, FetchWritesVerifiedFilesAndRefusesBadOnes) {
  const std::string adapter = "adapter bytes";
  fake_.artifacts_ = ArtifactChunks("output/adapter/adapter_model.safetensors", adapter,
                                    digest::Sha256Hex(adapter));
  const std::vector<v1::ArtifactChunk> log =
      ArtifactChunks("events.jsonl", "{}\n{}\n", digest::Sha256Hex("{}\n{}\n"));
  fake_.artifacts_.insert(fake_.artifacts_.end(), log.begin(), log.end());
  const fs::path to = dir_ / "out";
  ASSERT_EQ(Run({"fetch", "42", "a", "--to", to.string()}), kExitOk) << err_.str();
  std::ifstream in(to / "output" / "adapter" / "adapter_model.safetensors");
  std::string got((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(got, adapter);
  EXPECT_TRUE(fs::exists(to / "events.jsonl"));

  fake_.artifacts_ = ArtifactChunks("bad.bin", adapter, digest::Sha256Hex("something else"));
  EXPECT_EQ(Run({"fetch", "42", "a", "--to", to.string()}), kExitFailed);
  EXPECT_NE(err_.str().find("bad.bin: 13 bytes with sha256"), std::string::npos);
  EXPECT_FALSE(fs::exists(to / "bad.bin"));
  EXPECT_FALSE(fs::exists(to / "bad.bin.part"));  // nothing half-written is left behind

  fake_.artifacts_ = ArtifactChunks("../escape.bin", adapter, digest::Sha256Hex(adapter));
  EXPECT_EQ(Run({"fetch", "42", "a", "--to", to.string()}), kExitFailed);
  EXPECT_FALSE(fs::exists(dir_ / "escape.bin"));

  // A file as the destination is a wrong flag, refused before the controller is asked.
  Write("a-file", "kept");
  fake_.artifacts_ = ArtifactChunks("events.jsonl", adapter, digest::Sha256Hex(adapter));
  EXPECT_EQ(Run({"fetch", "42", "a", "--to", (dir_ / "a-file").string()}), kExitInvalidInput);
  EXPECT_NE(err_.str().find("a-file is not a directory; name a directory to fetch into"),
            std::string::npos)
      << err_.str();
  EXPECT_EQ(fs::file_size(dir_ / "a-file"), 4u);
}

std::string Contents(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// Every name the controller sends lies under output/ or is a top-level file of the run, and no
// link planted in the destination redirects a write: neither a directory on the way nor the
// ".part" file is followed.
TEST_F(CommandsTest, FetchWritesOnlyBelowItsDestinationWhateverIsPlantedThere) {
  const std::string adapter = "adapter bytes";
  const fs::path to = dir_ / "out";
  const fs::path victim = dir_ / "victim";
  fs::create_directories(to);
  fs::create_directories(victim);
  Write("victim/file", "untouched");

  fake_.artifacts_ = ArtifactChunks("input/data.jsonl", adapter, digest::Sha256Hex(adapter));
  EXPECT_EQ(Run({"fetch", "42", "a", "--to", to.string()}), kExitFailed);
  EXPECT_NE(err_.str().find("the controller sent artifact 'input/data.jsonl', which is not a "
                            "trial's artifact: a path outside the run's output/ directory"),
            std::string::npos)
      << err_.str();
  EXPECT_FALSE(fs::exists(to / "input"));

  // A planted .part link is replaced, not written through.
  fs::create_symlink(victim / "file", to / "events.jsonl.part");
  fake_.artifacts_ = ArtifactChunks("events.jsonl", adapter, digest::Sha256Hex(adapter));
  ASSERT_EQ(Run({"fetch", "42", "a", "--to", to.string()}), kExitOk) << err_.str();
  EXPECT_EQ(Contents(victim / "file"), "untouched");
  EXPECT_EQ(Contents(to / "events.jsonl"), adapter);
  EXPECT_FALSE(fs::is_symlink(to / "events.jsonl"));

  // A planted directory link on the way is refused.
  fs::create_directory_symlink(victim, to / "output");
  fake_.artifacts_ = ArtifactChunks("output/file", adapter, digest::Sha256Hex(adapter));
  EXPECT_EQ(Run({"fetch", "42", "a", "--to", to.string()}), kExitFailed);
  EXPECT_NE(err_.str().find((to / "output").string() +
                            ": a symbolic link; llmctl fetch writes "
                            "only into real directories below " +
                            to.string()),
            std::string::npos)
      << err_.str();
  EXPECT_EQ(Contents(victim / "file"), "untouched");
  EXPECT_FALSE(fs::exists(victim / "file.part"));
}

}  // namespace
}  // namespace llmctl::cli
