// The controller's API over real gRPC on a unix socket, with a real SQLite file in a fresh data
// directory per test (its nodes' handlers: controller_service_nodes_test.cc; on TCP, with its
// token: controller_service_tcp_test.cc).
#include "controller/controller_service.h"

#include <gtest/gtest.h>
#include <sqlite3.h>
#include <sys/stat.h>

#include <algorithm>
#include <filesystem>
#include <limits>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "common/digest/digest.h"
#include "common/estimate/step_work.h"
#include "common/files.h"
#include "controller/controller_service_test_support.h"
#include "controller/daemon.h"
#include "tests/support/shell_command.h"

namespace llmctl::controller {
namespace {

namespace fs = std::filesystem;
using test_support::ControllerServiceTest;
using test_support::kExperiment;
using test_support::ReadAll;

// One step event for each of `values` (100 tokens in 0.5 s each), `key` set to it: a trainer's
// lines with a field the controller must not take on trust.
std::vector<store::Event> StepsWith(const std::string& key,
                                    const std::vector<nlohmann::json>& values) {
  std::vector<store::Event> events;
  for (size_t i = 0; i < values.size(); ++i) {
    const nlohmann::json line = {
        {"type", "step"}, {"step", i}, {"tokens", 100}, {"seconds", 0.5}, {key, values[i]}};
    events.push_back({.seq = static_cast<int64_t>(i) + 1, .type = "step", .json = line.dump()});
  }
  return events;
}

// kExperiment submitted with a prediction of `step_seconds` a step for each trial of `trials`, over
// a one-token step's work.
v1::SubmitRequest SubmitWithPredictions(const std::vector<std::string>& trials,
                                        double step_seconds) {
  estimate::StepWork work;
  work.tokens = work.micro_batches = work.world_size = work.nodes = 1;
  v1::SubmitRequest request;
  request.set_filename("tiny.yaml");
  request.set_yaml_text(std::string(kExperiment));
  for (const std::string& trial : trials) {
    v1::TrialPrediction& prediction = (*request.mutable_predictions())[trial];
    prediction.set_peak_bytes(1024);
    prediction.set_step_seconds(step_seconds);
    prediction.set_tokens_per_second(1);
    prediction.set_trial_seconds(1);
    prediction.set_time_device("cpu");
    prediction.set_work_json(work.ToJson().dump());
  }
  return request;
}

TEST_F(ControllerServiceTest, SubmitStoresTheExperimentAndItsQueuedTrials) {
  v1::SubmitResponse submitted;
  grpc::Status status = Submit("tiny.yaml", kExperiment, &submitted);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_GT(submitted.experiment_id(), 0);
  EXPECT_EQ(submitted.name(), "tiny");
  EXPECT_EQ(std::vector<std::string>(submitted.trials().begin(), submitted.trials().end()),
            (std::vector<std::string>{"a", "b"}));

  grpc::ClientContext context;
  v1::GetExperimentRequest latest;  // id 0: the latest
  v1::ExperimentStatus experiment;
  ASSERT_TRUE(stub_->GetExperiment(&context, latest, &experiment).ok());
  EXPECT_EQ(experiment.id(), submitted.experiment_id());
  EXPECT_EQ(experiment.state(), "queued");
  ASSERT_EQ(experiment.trials_size(), 2);
  EXPECT_EQ(experiment.trials(0).state(), "queued");
  EXPECT_EQ(experiment.trials(1).name(), "b");

  grpc::ClientContext list_context;
  v1::ListExperimentsResponse list;
  ASSERT_TRUE(stub_->ListExperiments(&list_context, {}, &list).ok());
  ASSERT_EQ(list.experiments_size(), 1);
  EXPECT_EQ(list.experiments(0).filename(), "tiny.yaml");
  EXPECT_EQ(list.experiments(0).trials(), 2);
  EXPECT_EQ(list.experiments(0).state(), "queued");
}

// Paths that name the user's files cannot be checked where only the text arrives; these fixtures
// fail at the CLI (resolve_local_paths) and are taken on trust by the controller.
const std::set<std::string> kNeedTheUsersFiles = {"model_dir_bad_config.yaml",
                                                  "unknown_model.yaml"};

// The broken-experiment corpus (tests/fixtures/experiments/broken, shared with common/'s parser
// test): each file gets INVALID_ARGUMENT with its expected message, located in that file, and
// nothing is stored.
TEST_F(ControllerServiceTest, EveryBrokenExperimentIsRefusedAndNothingIsStored) {
  const fs::path dir = llmctl::testing::SourceDir() / "tests/fixtures/experiments/broken";
  std::vector<fs::path> files;
  for (const fs::directory_entry& entry : fs::directory_iterator(dir)) {
    if (entry.path().extension() == ".yaml") files.push_back(entry.path());
  }
  std::sort(files.begin(), files.end());
  ASSERT_GE(files.size(), 40u);
  std::set<std::string> accepted;
  for (const fs::path& file : files) {
    SCOPED_TRACE(file.filename().string());
    fs::path expected_file = file;
    expected_file.replace_extension(".expected");
    std::string expected = ReadAll(expected_file);
    while (!expected.empty() && expected.back() == '\n') expected.pop_back();
    const std::string filename = "broken/" + file.filename().string();
    v1::SubmitResponse response;
    grpc::Status status = Submit(filename, ReadAll(file), &response);
    if (status.ok()) {
      accepted.insert(file.filename().string());
      continue;
    }
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_EQ(status.error_message().rfind(filename + ":", 0), 0u) << status.error_message();
    EXPECT_NE(status.error_message().find(expected), std::string::npos)
        << "message: " << status.error_message() << "\nexpected: " << expected;
  }
  EXPECT_EQ(accepted, kNeedTheUsersFiles);
  EXPECT_EQ(ExperimentCount(), static_cast<int>(kNeedTheUsersFiles.size()));
}

TEST_F(ControllerServiceTest, InputsMustBeUploadedWholeBeforeSubmit) {
  const std::string content = "{\"text\": \"hello\"}\n";
  auto sha = [](std::string_view data) { return digest::Sha256Hex(data); };
  v1::InputTree tree;
  tree.set_is_file(true);
  v1::TreeFile* file = tree.add_files();
  file->set_path("train.jsonl");
  file->set_sha256(sha(content));
  file->set_size(static_cast<int64_t>(content.size()));
  tree.set_digest(digest::TreeDigest(std::vector<digest::TreeFile>{
      {"train.jsonl", sha(content), static_cast<int64_t>(content.size())}}));

  v1::SubmitResponse response;
  grpc::Status early = Submit("tiny.yaml", kExperiment, &response, {{"data/train.jsonl", tree}});
  EXPECT_EQ(early.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(early.error_message().find("input 'data/train.jsonl'"), std::string::npos);
  EXPECT_EQ(ExperimentCount(), 0);

  {
    grpc::ClientContext context;
    v1::MissingBlobsRequest request;
    request.add_sha256(sha(content));
    v1::MissingBlobsResponse missing;
    ASSERT_TRUE(stub_->MissingBlobs(&context, request, &missing).ok());
    EXPECT_EQ(missing.sha256_size(), 1);
  }
  v1::UploadBlobResponse uploaded;
  grpc::Status tampered = Upload(sha(content), static_cast<int64_t>(content.size()),
                                 {content.substr(0, 3), "X" + content.substr(4)}, &uploaded);
  EXPECT_EQ(tampered.error_code(), grpc::StatusCode::DATA_LOSS);
  ASSERT_TRUE(Upload(sha(content), static_cast<int64_t>(content.size()),
                     {content.substr(0, 3), content.substr(3)}, &uploaded)
                  .ok());
  EXPECT_FALSE(uploaded.already_present());
  ASSERT_TRUE(
      Upload(sha(content), static_cast<int64_t>(content.size()), {content}, &uploaded).ok());
  EXPECT_TRUE(uploaded.already_present());
  // A blob the controller has is drained only up to the size announced, not for as long as the
  // client writes.
  const grpc::Status endless = Upload(sha(content), static_cast<int64_t>(content.size()),
                                      {content, std::string(1 << 20, 'x')}, &uploaded);
  EXPECT_EQ(endless.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << endless.error_message();

  grpc::Status late = Submit("tiny.yaml", kExperiment, &response, {{"data/train.jsonl", tree}});
  ASSERT_TRUE(late.ok()) << late.error_message();
  auto inputs = daemon_->store().GetInputs(response.experiment_id());
  ASSERT_TRUE(inputs.ok());
  EXPECT_EQ(*inputs, (std::map<std::string, std::string>{{"data/train.jsonl", tree.digest()}}));

  grpc::ClientContext context;
  v1::MissingBlobsRequest bad;
  bad.add_sha256("../../etc/passwd");
  v1::MissingBlobsResponse missing;
  EXPECT_EQ(stub_->MissingBlobs(&context, bad, &missing).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
}

// The socket is bound under umask 077 (rpc::BuildAndStartServer): 0700, connecting takes its write
// permission, the owner's alone.
TEST_F(ControllerServiceTest, TheSocketIsPrivate) {
  struct stat info;
  ASSERT_EQ(stat((root_ + "/run/controller.sock").c_str(), &info), 0);
  EXPECT_EQ(info.st_mode & 0777, 0700u);
  ASSERT_EQ(stat((root_ + "/run").c_str(), &info), 0);
  EXPECT_EQ(info.st_mode & 0777, 0700u);
  ASSERT_EQ(stat((root_ + "/data/ca/ca.key").c_str(), &info), 0);
  EXPECT_EQ(info.st_mode & 0777, 0600u);
}

TEST_F(ControllerServiceTest, ASecondControllerDoesNotTakeOverTheSocket) {
  ControllerConfig config;
  config.data_dir = root_ + "/data2";
  config.listen = "unix:" + root_ + "/run/controller.sock";
  auto second = Daemon::Start(config, clock_, {.run_dispatcher = false});
  EXPECT_EQ(second.status().code(), StatusCode::kFailedPrecondition);
  // The first still answers.
  EXPECT_EQ(ExperimentCount(), 0);
}

TEST_F(ControllerServiceTest, ASecondControllerOnTheSameDataDirectoryIsRefused) {
  grpc::ClientContext context;
  v1::RegisterNodeRequest request;
  request.set_name("gpu-1");
  request.set_address("127.0.0.1:7443");
  v1::NodeCredentials credentials;
  ASSERT_TRUE(stub_->RegisterNode(&context, request, &credentials).ok());
  const std::string secrets = *ReadFileToString(root_ + "/data/secrets.json", 1 << 20);

  // Another socket, the same data: it would rewrite secrets.json from its own memory.
  ControllerConfig config;
  config.data_dir = root_ + "/data";
  config.listen = "unix:" + root_ + "/run2/controller.sock";
  auto second = Daemon::Start(config, clock_, {.run_dispatcher = false});
  EXPECT_EQ(second.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(second.status().message(), std::string("another llmctld (pid ")
                                           .append(std::to_string(getpid()))
                                           .append(") is using the data directory ")
                                           .append(config.data_dir)
                                           .append("; stop it, or give this one another data_dir"));
  EXPECT_FALSE(fs::exists(root_ + "/run2/controller.sock"));
  EXPECT_EQ(*ReadFileToString(root_ + "/data/secrets.json", 1 << 20), secrets);
  EXPECT_EQ(ExperimentCount(), 0);  // the first still answers

  // Once the first has stopped, the directory is free again.
  daemon_.reset();
  auto after = Daemon::Start(config, clock_, {.run_dispatcher = false});
  EXPECT_TRUE(after.ok()) << after.status().ToString();
}

TEST_F(ControllerServiceTest, CancellingQueuedTrialsEndsTheExperimentAndItsWatch) {
  v1::SubmitResponse submitted;
  ASSERT_TRUE(Submit("tiny.yaml", kExperiment, &submitted).ok());

  grpc::ClientContext one_context;
  v1::CancelRequest one;
  one.set_experiment_id(submitted.experiment_id());
  one.set_trial("a");
  v1::CancelResponse cancelled;
  ASSERT_TRUE(stub_->Cancel(&one_context, one, &cancelled).ok());
  EXPECT_EQ(std::vector<std::string>(cancelled.cancelled().begin(), cancelled.cancelled().end()),
            std::vector<std::string>{"a"});

  grpc::ClientContext unknown_context;
  one.set_trial("nope");
  EXPECT_EQ(stub_->Cancel(&unknown_context, one, &cancelled).error_code(),
            grpc::StatusCode::NOT_FOUND);

  // A watcher sees the change and the end.
  grpc::ClientContext watch_context;
  v1::GetExperimentRequest watched;
  watched.set_experiment_id(submitted.experiment_id());
  auto reader = stub_->Watch(&watch_context, watched);
  v1::ExperimentStatus status;
  ASSERT_TRUE(reader->Read(&status));
  EXPECT_EQ(status.trials(0).state(), "cancelled");
  EXPECT_EQ(status.trials(1).state(), "queued");

  grpc::ClientContext all_context;
  v1::CancelRequest all;
  all.set_experiment_id(submitted.experiment_id());
  ASSERT_TRUE(stub_->Cancel(&all_context, all, &cancelled).ok());
  EXPECT_EQ(std::vector<std::string>(cancelled.cancelled().begin(), cancelled.cancelled().end()),
            std::vector<std::string>{"b"});
  v1::ExperimentStatus last;
  while (reader->Read(&status)) last = status;
  EXPECT_TRUE(reader->Finish().ok());
  EXPECT_EQ(last.state(), "ended");
  EXPECT_EQ(last.trials(1).state(), "cancelled");

  v1::ReportResponse report;
  ASSERT_TRUE(Report(submitted.experiment_id(), &report).ok());
  ASSERT_EQ(report.trials_size(), 2);
  EXPECT_EQ(report.trials(0).outcome(), "cancelled");
  EXPECT_EQ(report.trials(0).attempt(), 0);
  EXPECT_FALSE(report.trials(0).has_final_loss());
  EXPECT_FALSE(report.trials(0).config_json().empty());
}

// A trial name the caller sent, refused as unknown, is quoted on one line and cut short: the
// refusal reaches a terminal and the log, where a newline forged a line and an escape reached it.
TEST_F(ControllerServiceTest, AnUnknownTrialsNameIsQuotedPrintableInItsRefusal) {
  v1::SubmitResponse submitted;
  ASSERT_TRUE(Submit("tiny.yaml", kExperiment, &submitted).ok());
  const std::string hostile = "x\x1b[2J\nFORGED " + std::string(100'000, 'y');
  auto expect_quoted = [](const grpc::Status& status) {
    EXPECT_EQ(status.error_code(), grpc::StatusCode::NOT_FOUND);
    EXPECT_NE(status.error_message().find("has no trial 'x [2J FORGED y"), std::string::npos)
        << status.error_message().substr(0, 300);
    EXPECT_LT(status.error_message().size(), 400u);
  };
  grpc::ClientContext cancel_context;
  v1::CancelRequest cancel;
  cancel.set_experiment_id(submitted.experiment_id());
  cancel.set_trial(hostile);
  v1::CancelResponse cancelled;
  expect_quoted(stub_->Cancel(&cancel_context, cancel, &cancelled));

  grpc::ClientContext resume_context;
  v1::ResumeRequest resume;
  resume.set_experiment_id(submitted.experiment_id());
  resume.set_trial(hostile);
  v1::ResumeResponse resumed;
  expect_quoted(stub_->Resume(&resume_context, resume, &resumed));

  grpc::ClientContext fetch_context;
  v1::FetchTrialArtifactsRequest fetch;
  fetch.set_experiment_id(submitted.experiment_id());
  fetch.set_trial(hostile);
  auto reader = stub_->FetchArtifacts(&fetch_context, fetch);
  v1::ArtifactChunk chunk;
  EXPECT_FALSE(reader->Read(&chunk));
  expect_quoted(reader->Finish());
}

// Issue 37: an infinite predicted time was stored (JSON writes it as null), and every Report of its
// experiment then failed with INTERNAL. Submit now refuses a non-finite prediction, and Report
// reads a stored null (from before) as no value.
TEST_F(ControllerServiceTest, NonFinitePredictionsAreRefusedAndAStoredNullReportsAsAbsent) {
  v1::SubmitRequest request = SubmitWithPredictions({"a"}, std::numeric_limits<double>::infinity());
  v1::TrialPrediction& prediction = (*request.mutable_predictions())["a"];
  v1::SubmitResponse submitted;
  {
    grpc::ClientContext context;
    const grpc::Status refused = stub_->Submit(&context, request, &submitted);
    EXPECT_EQ(refused.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_EQ(refused.error_message(),
              "tiny.yaml: prediction of trial 'a': step_seconds must be a finite non-negative "
              "number");
  }
  prediction.set_step_seconds(2);
  {
    grpc::ClientContext context;
    ASSERT_TRUE(stub_->Submit(&context, request, &submitted).ok());
  }
  // What an earlier controller stored for an infinite time and throughput.
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open((root_ + "/data/llmctl.db").c_str(), &db), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(db,
                         "UPDATE trials SET prediction_json = '{\"peak_bytes\":1024,"
                         "\"step_seconds\":null,\"tokens_per_second\":null,\"verdict\":null}' "
                         "WHERE name = 'a'",
                         nullptr, nullptr, nullptr),
            SQLITE_OK);
  EXPECT_EQ(sqlite3_changes(db), 1);
  sqlite3_close(db);

  v1::ReportResponse report;
  const grpc::Status reported = Report(submitted.experiment_id(), &report);
  ASSERT_TRUE(reported.ok()) << reported.error_message();
  ASSERT_EQ(report.trials_size(), 2);
  EXPECT_EQ(report.trials(0).prediction().peak_bytes(), 1024);
  EXPECT_EQ(report.trials(0).prediction().step_seconds(), 0);
  EXPECT_EQ(report.trials(0).prediction().verdict(), "");
}

// TimedRuns sends the store's calibration material: each trial that ended ok with a predicted
// time, with its prediction and its median step; a failed trial is not one.
// A client's work_json nested 100,000 deep is refused like any broken work: a copy of it once
// overflowed the controller's stack.
TEST_F(ControllerServiceTest, ADeeplyNestedWorkIsRefusedAndTheControllerAnswersOn) {
  v1::SubmitRequest request = SubmitWithPredictions({"a"}, 2);
  (*request.mutable_predictions())["a"].set_work_json(
      R"({"matmul_class":)" + std::string(100000, '[') + std::string(100000, ']') + "}");
  v1::SubmitResponse submitted;
  grpc::ClientContext context;
  const grpc::Status refused = stub_->Submit(&context, request, &submitted);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << refused.error_message();
  EXPECT_EQ(refused.error_message(),
            "tiny.yaml: prediction of trial 'a': step work: expected an object");
  grpc::ClientContext again;
  EXPECT_TRUE(stub_->Submit(&again, SubmitWithPredictions({"a"}, 2), &submitted).ok());
}

TEST_F(ControllerServiceTest, TimedRunsAreTheOkTrialsWithTheirPredictionAndMedianStep) {
  const v1::SubmitRequest request = SubmitWithPredictions({"a", "b"}, 0.5);
  v1::SubmitResponse submitted;
  {
    grpc::ClientContext context;
    ASSERT_TRUE(stub_->Submit(&context, request, &submitted).ok());
  }
  store::Store& store = daemon_->store();
  const std::vector<store::TrialRecord> trials = *store.ListTrials(submitted.experiment_id());
  ASSERT_EQ(trials.size(), 2u);
  const store::TrialState ends[] = {store::TrialState::kOk, store::TrialState::kFailed};
  for (size_t i = 0; i < trials.size(); ++i) {
    ASSERT_EQ(*store.StartAttempt(trials[i].id, "local", clock_.Now()), 1);
    std::vector<store::Event> events;
    for (int64_t step = 0; step < 4; ++step) {
      const nlohmann::json line = {
          {"type", "step"}, {"step", step}, {"tokens", 100}, {"seconds", 0.5 + 0.1 * step}};
      events.push_back({.seq = step + 1, .type = "step", .json = line.dump()});
    }
    ASSERT_TRUE(store.AppendEvents(trials[i].id, 1, events).ok());
    ASSERT_TRUE(store.FinishAttempt(trials[i].id, 1, ends[i], 0, "", clock_.Now()).ok());
  }

  grpc::ClientContext context;
  v1::TimedRunsResponse runs;
  const grpc::Status listed = stub_->TimedRuns(&context, {}, &runs);
  ASSERT_TRUE(listed.ok()) << listed.error_message();
  ASSERT_EQ(runs.runs_size(), 1);
  const nlohmann::json prediction = nlohmann::json::parse(runs.runs(0).prediction_json());
  EXPECT_EQ(prediction["time_device"], "cpu");
  EXPECT_EQ(prediction["work"], nlohmann::json::parse(request.predictions().at("a").work_json()));
  // Steps 1 to 3: 0.6, 0.7 and 0.8 s for 100 tokens each.
  EXPECT_DOUBLE_EQ(runs.runs(0).seconds_per_token(), 0.007);
  EXPECT_EQ(runs.runs(0).steps(), 3);
}

// A step's others_cpu_share reaches the report only as a share: the trainer's line is untrusted.
TEST_F(ControllerServiceTest, ReportCarriesAStepsCpuShareOnlyWhenItIsOne) {
  v1::SubmitResponse submitted;
  ASSERT_TRUE(Submit("tiny.yaml", kExperiment, &submitted).ok());
  store::Store& store = daemon_->store();
  const int64_t trial = store.ListTrials(submitted.experiment_id())->at(0).id;
  ASSERT_EQ(*store.StartAttempt(trial, "local", clock_.Now()), 1);
  const std::vector<nlohmann::json> shares = {0.25, 1.5, -0.1, "x", nullptr, 0, 1};
  ASSERT_TRUE(store.AppendEvents(trial, 1, StepsWith("others_cpu_share", shares)).ok());
  v1::ReportResponse report;
  ASSERT_TRUE(Report(submitted.experiment_id(), &report).ok());
  const v1::TrialReport& row = report.trials(0);
  ASSERT_EQ(row.steps_size(), 7);
  std::vector<std::string> read;
  for (const v1::TrialStep& step : row.steps()) {
    read.push_back(step.has_others_cpu_share() ? std::to_string(step.others_cpu_share()) : "-");
  }
  EXPECT_EQ(read,
            (std::vector<std::string>{"0.250000", "-", "-", "-", "-", "0.000000", "1.000000"}));
}

// A step's pace_seconds reaches the report only as a pace canary's seconds, and a prediction's
// pace_seconds is stored only as one: both are another process's word.
TEST_F(ControllerServiceTest, ReportCarriesAPaceOnlyWhenItIsACanarysSeconds) {
  v1::SubmitRequest request = SubmitWithPredictions({"a"}, 0.5);
  v1::TrialPrediction& prediction = (*request.mutable_predictions())["a"];
  v1::SubmitResponse submitted;
  for (const double refused : {-0.001, 2.0, 1e-9}) {
    prediction.set_pace_seconds(refused);
    grpc::ClientContext context;
    const grpc::Status status = stub_->Submit(&context, request, &submitted);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << refused;
    EXPECT_EQ(status.error_message(),
              "tiny.yaml: prediction of trial 'a': pace_seconds must be a pace canary's seconds");
  }
  prediction.set_pace_seconds(0.0011);
  {
    grpc::ClientContext context;
    ASSERT_TRUE(stub_->Submit(&context, request, &submitted).ok());
  }
  store::Store& store = daemon_->store();
  const int64_t trial = store.ListTrials(submitted.experiment_id())->at(0).id;
  ASSERT_EQ(*store.StartAttempt(trial, "local", clock_.Now()), 1);
  const std::vector<nlohmann::json> paces = {0.001, 2.0, -0.1, "x", nullptr, 0, 1e-9, 1};
  ASSERT_TRUE(store.AppendEvents(trial, 1, StepsWith("pace_seconds", paces)).ok());
  v1::ReportResponse report;
  ASSERT_TRUE(Report(submitted.experiment_id(), &report).ok());
  const v1::TrialReport& row = report.trials(0);
  EXPECT_DOUBLE_EQ(row.prediction().pace_seconds(), 0.0011);
  EXPECT_EQ(report.trials(1).prediction().pace_seconds(), 0);
  ASSERT_EQ(row.steps_size(), 8);
  std::vector<std::string> read;
  for (const v1::TrialStep& step : row.steps()) {
    read.push_back(step.has_pace_seconds() ? std::to_string(step.pace_seconds()) : "-");
  }
  EXPECT_EQ(read, (std::vector<std::string>{"0.001000", "-", "-", "-", "-", "-", "-", "1.000000"}));
}

// The report's memory over time is what the store holds: each snapshot of the run's attempts with
// its time, the attempt's start and device limit, and the device samples of those attempts only.
TEST_F(ControllerServiceTest, ReportCarriesTheRunsSnapshotsAndDeviceSamplesOverTime) {
  v1::SubmitResponse submitted;
  ASSERT_TRUE(Submit("tiny.yaml", kExperiment, &submitted).ok());
  store::Store& store = daemon_->store();
  const int64_t trial = store.ListTrials(submitted.experiment_id())->at(0).id;
  const auto sample = [&](int64_t seq, int64_t after_ms, int64_t used) {
    store::NewDeviceSample reading{.seq = seq, .sample = {}};
    reading.sample.device = "cuda:0";
    reading.sample.time = store::Time(std::chrono::milliseconds(1'700'000'000'000 + after_ms));
    reading.sample.memory_used_bytes = used;
    reading.sample.memory_total_bytes = 80LL << 30;
    return reading;
  };
  // Attempt 1 is lost: neither its snapshots nor its samples are the run's.
  ASSERT_EQ(*store.StartAttempt(trial, "local", clock_.Now()), 1);
  const nlohmann::json lost_snapshot = {{"type", "snapshot"},
                                        {"phase", "phase0_before_fwd"},
                                        {"allocated_bytes", 1},
                                        {"elapsed_ms", 5.0}};
  const std::vector<store::Event> lost_events = {
      {.seq = 1, .type = "snapshot", .json = lost_snapshot.dump()}};
  ASSERT_TRUE(store.AppendEvents(trial, 1, lost_events).ok());
  ASSERT_TRUE(store.AppendDeviceSamples(trial, 1, std::vector{sample(1, 0, 7)}).ok());
  ASSERT_TRUE(store.MarkAttemptLost(trial, 1, clock_.Now()).ok());

  ASSERT_EQ(*store.StartAttempt(trial, "local", clock_.Now()), 2);
  const nlohmann::json start = {{"type", "start"},
                                {"started_unix_ms", 1'700'000'060'000},
                                {"device_limit_bytes", 40LL << 30}};
  std::vector<nlohmann::json> snapshots;
  for (const auto& [phase, allocated, elapsed_ms] :
       std::vector<std::tuple<std::string, int64_t, double>>{
           {"phase0_before_fwd", 3LL << 30, 1500.25},
           {"phase1_after_fwd", 9LL << 30, 1900.5},
           {"oom", 39LL << 30, 2000}}) {
    snapshots.push_back({{"type", "snapshot"},
                         {"step", 0},
                         {"micro_batch", phase == "oom" ? -1 : 0},
                         {"phase", phase},
                         {"params_bytes", 1LL << 30},
                         {"allocated_bytes", allocated},
                         {"peak_bytes", allocated},
                         {"reserved_bytes", allocated + (1LL << 20)},
                         {"elapsed_ms", elapsed_ms}});
  }
  std::vector<store::Event> events = {{.seq = 1, .type = "start", .json = start.dump()}};
  for (const nlohmann::json& snapshot : snapshots) {
    events.push_back({.seq = static_cast<int64_t>(events.size()) + 1,
                      .type = "snapshot",
                      .json = snapshot.dump()});
  }
  const nlohmann::json result = {{"type", "result"}, {"outcome", "oom"}, {"elapsed_ms", 2'100.5}};
  events.push_back(
      {.seq = static_cast<int64_t>(events.size()) + 1, .type = "result", .json = result.dump()});
  ASSERT_TRUE(store.AppendEvents(trial, 2, events).ok());
  ASSERT_TRUE(
      store
          .AppendDeviceSamples(
              trial, 2, std::vector{sample(1, 60'500, 2LL << 30), sample(2, 61'500, 10LL << 30)})
          .ok());

  v1::ReportResponse report;
  ASSERT_TRUE(Report(submitted.experiment_id(), &report).ok());
  const v1::TrialReport& row = report.trials(0);
  ASSERT_EQ(row.memory_timeline_size(), 1);
  const v1::AttemptMemory& attempt = row.memory_timeline(0);
  EXPECT_EQ(attempt.attempt(), 2);
  EXPECT_EQ(attempt.started_unix_ms(), 1'700'000'060'000);
  EXPECT_EQ(attempt.device_limit_bytes(), 40LL << 30);
  EXPECT_EQ(attempt.ended_elapsed_ms(), 2'100.5);
  ASSERT_EQ(attempt.snapshots_size(), 3);
  for (int i = 0; i < 3; ++i) {
    const v1::MemorySnapshot& drawn = attempt.snapshots(i);
    const nlohmann::json& stored = snapshots[static_cast<size_t>(i)];
    EXPECT_EQ(drawn.phase(), stored["phase"]);
    EXPECT_EQ(drawn.micro_batch(), stored["micro_batch"]);
    EXPECT_EQ(drawn.params_bytes(), stored["params_bytes"]);
    EXPECT_EQ(drawn.allocated_bytes(), stored["allocated_bytes"]);
    EXPECT_EQ(drawn.reserved_bytes(), stored["reserved_bytes"]);
    EXPECT_EQ(drawn.elapsed_ms(), stored["elapsed_ms"].get<double>());
  }
  ASSERT_EQ(attempt.device_samples_size(), 2);
  EXPECT_EQ(attempt.device_samples(0).device(), "cuda:0");
  EXPECT_EQ(attempt.device_samples(0).unix_ms(), 1'700'000'060'500);
  EXPECT_EQ(attempt.device_samples(1).memory_used_bytes(), 10LL << 30);
  EXPECT_EQ(attempt.device_samples(1).memory_total_bytes(), 80LL << 30);
}

TEST_F(ControllerServiceTest, UnknownExperimentsAreNotFound) {
  grpc::ClientContext context;
  v1::ExperimentStatus status;
  EXPECT_EQ(stub_->GetExperiment(&context, {}, &status).error_code(), grpc::StatusCode::NOT_FOUND);
  grpc::ClientContext other;
  v1::GetExperimentRequest request;
  request.set_experiment_id(42);
  EXPECT_EQ(stub_->GetExperiment(&other, request, &status).error_code(),
            grpc::StatusCode::NOT_FOUND);
}

TEST_F(ControllerServiceTest, ASocketDirectoryItDidNotCreateIsNeverChmodded) {
  // Shared or foreign directories (/tmp as root): refused, and left as they were.
  const std::string shared = root_ + "/shared";
  ASSERT_EQ(mkdir(shared.c_str(), 0700), 0);
  ASSERT_EQ(chmod(shared.c_str(), 01777), 0);
  ControllerConfig config;
  config.data_dir = root_ + "/data3";
  config.listen = "unix:" + shared + "/controller.sock";
  auto refused = Daemon::Start(config, clock_, {.run_dispatcher = false});
  EXPECT_EQ(refused.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(refused.status().message(),
            shared + ": open to other users (mode 1777); llmctld changes no directory it did not " +
                "create: choose a path in a new or private directory (e.g. unix:" + shared +
                "/llmctl/controller.sock)");
  struct stat info;
  ASSERT_EQ(stat(shared.c_str(), &info), 0);
  EXPECT_EQ(info.st_mode & 07777, 01777u);
  EXPECT_FALSE(fs::exists(shared + "/controller.sock"));

  // One that is this user's but readable by others: refused too, not narrowed.
  ASSERT_EQ(chmod(shared.c_str(), 0755), 0);
  EXPECT_EQ(Daemon::Start(config, clock_, {.run_dispatcher = false}).status().code(),
            StatusCode::kFailedPrecondition);
  ASSERT_EQ(stat(shared.c_str(), &info), 0);
  EXPECT_EQ(info.st_mode & 07777, 0755u);

  // A private one of this user's, or one llmctld makes itself, serves.
  ASSERT_EQ(chmod(shared.c_str(), 0700), 0);
  auto served = Daemon::Start(config, clock_, {.run_dispatcher = false});
  EXPECT_TRUE(served.ok()) << served.status().ToString();
}

}  // namespace
}  // namespace llmctl::controller
