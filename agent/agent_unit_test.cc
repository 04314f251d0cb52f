// The agent's pure parts: trial files, the input cache, event following, node probing.
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <stop_token>
#include <thread>

#include "agent/hub_listing.h"
#include "agent/input_cache.h"
#include "agent/node_info.h"
#include "agent/process.h"
#include "agent/run_checks.h"
#include "agent/run_files.h"
#include "agent/runs.h"
#include "agent/server.h"
#include "agent/supervisor.h"
#include "agent/trial_file.h"
#include "common/digest/digest.h"
#include "common/experiment.h"
#include "common/files.h"
#include "common/nvml/fake_gpu_probe.h"
#include "common/text.h"
#include "rpc/certificates.h"
#include "tests/support/shell_command.h"

namespace llmctl::agent {
namespace {

namespace fs = std::filesystem;

fs::path FreshDir(const std::string& name) {
  const fs::path dir =
      fs::temp_directory_path() / ("llmctl_agent_unit_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

TEST(RunChecksTest, OneNodeRunsAtMostMaxRanksRanks) {
  TrialFile trial_file;
  trial_file.device = "cpu";
  trial_file.ranks = kMaxRanks;
  EXPECT_TRUE(CheckTrialPlacement(RunRequest{}, trial_file).ok());
  trial_file.ranks = kMaxRanks + 1;
  EXPECT_EQ(CheckTrialPlacement(RunRequest{}, trial_file).message(),
            "the trial's 1025 ranks are more than 1024 on one node");
}

TEST(TrialFileTest, InputsReplaceValuesUnsetKeysAreLeftOutAndLlmTrainParsesIt) {
  const fs::path dir = FreshDir("trial_file");
  auto experiment = LoadExperimentFile("experiments/demo.yaml");
  ASSERT_TRUE(experiment.ok()) << experiment.status().ToString();
  TrialConfig config = experiment->trials.front().config;
  ASSERT_TRUE(config.Set("train.max_steps", int64_t{2}).ok());
  const std::string data = (dir / "data.jsonl").string();
  auto file = MakeTrialFile(config.ToJson().dump(), {{"data.path", data}}, (dir / "out").string());
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  EXPECT_EQ(file->device, "cpu");
  // Messages about the copy name what the experiment wrote (llm-train --input-name).
  const std::map<std::string, std::string> names = {{data, config.GetString("data.path")}};
  EXPECT_EQ(file->input_names, names);
  EXPECT_EQ(file->yaml.find("null"), std::string::npos) << file->yaml;
  EXPECT_EQ(file->yaml.find("device_memory"), std::string::npos)
      << "keys the experiment did not set are left out";
  std::ofstream(dir / "trial.yaml") << file->yaml;
  // What llm-train does with --config: parse the file as an experiment.
  auto parsed = LoadExperimentFile((dir / "trial.yaml").string());
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString() << "\n" << file->yaml;
  ASSERT_EQ(parsed->trials.size(), 1u);
  const TrialConfig& trial = parsed->trials.front().config;
  EXPECT_EQ(trial.GetString("data.path"), data);
  EXPECT_EQ(trial.GetString("output_dir"), (dir / "out").string());
  EXPECT_EQ(trial.GetInt("train.max_steps"), 2);
  EXPECT_EQ(trial.GetFloat("train.lr"), config.GetFloat("train.lr"));
  EXPECT_EQ(trial.GetFloatList("train.betas"), config.GetFloatList("train.betas"));
  EXPECT_EQ(trial.GetString("tokenizer"), config.GetString("tokenizer"));
  fs::remove_all(dir);
}

TEST(TrialFileTest, TheFileSetsExactlyTheKeysTheExperimentSet) {
  const fs::path dir = FreshDir("trial_file_keys");
  TrialConfig config;
  for (const auto& [key, value] : {std::pair{"model", "llmctl-demo"},
                                   {"peft.method", "lora"},
                                   {"peft.r", "4"},
                                   {"precision", "32-true"},  // its default, written explicitly
                                   {"device_memory", ""}}) {  // cleared
    ASSERT_TRUE(config.SetFromText(key, value).ok()) << key;
  }
  const std::string data = (dir / "data.jsonl").string();
  auto file = MakeTrialFile(config.ToJson().dump(), {{"data.path", data}}, (dir / "out").string());
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  EXPECT_EQ(file->yaml.find("peft.compute_dtype"), std::string::npos) << file->yaml;
  std::ofstream(dir / "trial.yaml") << file->yaml;
  auto parsed = LoadExperimentFile((dir / "trial.yaml").string());
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString() << "\n" << file->yaml;
  const TrialConfig& trial = parsed->trials.front().config;
  ASSERT_TRUE(config.Set("data.path", data).ok());
  ASSERT_TRUE(config.Set("output_dir", (dir / "out").string()).ok());
  EXPECT_TRUE(trial == config);
  for (const KeySpec& spec : TrialKeys()) {
    EXPECT_EQ(trial.IsSet(spec.name), config.IsSet(spec.name)) << spec.name << "\n" << file->yaml;
  }
  fs::remove_all(dir);
}

TEST(TrialFileTest, BadConfigsAndInputsAreNamed) {
  EXPECT_EQ(MakeTrialFile("[1]", {}, "/o").status().code(), StatusCode::kInvalidArgument);
  auto unknown = MakeTrialFile(R"({"train": {"lrr": 1}})", {}, "/o");
  EXPECT_NE(unknown.status().message().find("lrr"), std::string::npos)
      << unknown.status().message();
  auto not_a_path = MakeTrialFile("{}", {{"train.lr", "/x"}}, "/o");
  EXPECT_NE(not_a_path.status().message().find("train.lr"), std::string::npos);
}

// The agent runs trials as root and does not trust the controller's check: output_dir is a path
// inside the run's output/ or the run is refused.
TEST(TrialFileTest, OutputDirStaysInsideTheRunsOutputDirectory) {
  // The trial file's output_dir line (the file holds no other path).
  auto within = [](const std::string& config_json) -> StatusOr<std::string> {
    ASSIGN_OR_RETURN(TrialFile file, MakeTrialFile(config_json, {}, "/r/output"));
    const size_t start = file.yaml.find("output_dir: ");
    if (start == std::string::npos) return InternalError("no output_dir in " + file.yaml);
    return file.yaml.substr(start, file.yaml.find('\n', start) - start);
  };
  EXPECT_EQ(*within(R"({"output_dir": "out"})"), "output_dir: /r/output/out");
  EXPECT_EQ(*within(R"({"output_dir": "./a/../b/"})"), "output_dir: /r/output/b");
  EXPECT_EQ(*within(R"({"output_dir": "."})"), "output_dir: /r/output");
  EXPECT_EQ(*within("{}"), "output_dir: /r/output");
  for (const auto& [output_dir, why] :
       {std::pair<std::string, std::string>{"/elsewhere", "is an absolute path"},
        {"..", "climbs out of output/"},
        {"a/../../checkpoints", "climbs out of output/"},
        {"node:/scratch/out", "is a node path"}}) {
    StatusOr<std::string> refused = within(R"({"output_dir": ")" + output_dir + R"("})");
    ASSERT_EQ(refused.status().code(), StatusCode::kInvalidArgument) << output_dir;
    EXPECT_NE(refused.status().message().find("output_dir: '" + output_dir + "' " + why),
              std::string::npos)
        << refused.status().message();
  }
}

class InputCacheTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = FreshDir("cache");
    auto cache = InputCache::Open(dir_.string());
    ASSERT_TRUE(cache.ok()) << cache.status().ToString();
    cache_ = std::move(*cache);
  }
  void TearDown() override { fs::remove_all(dir_); }

  Status Upload(const std::string& sha256, const std::string& data, int64_t size) {
    ASSIGN_OR_RETURN(auto upload, cache_->BeginUpload(sha256, size));
    RETURN_IF_ERROR(upload->Append(data.substr(0, data.size() / 2)));
    RETURN_IF_ERROR(upload->Append(data.substr(data.size() / 2)));
    return upload->Commit(sha256);
  }
  bool DirEmpty(const std::string& sub) { return fs::is_empty(dir_ / sub); }

  fs::path dir_;
  std::unique_ptr<InputCache> cache_;
};

TEST_F(InputCacheTest, UploadsAreVerifiedAndNothingHalfWrittenStays) {
  const std::string data = "hello world\n";
  const std::string sha = digest::Sha256Hex(data);
  EXPECT_EQ(*cache_->MissingBlobs({sha}), std::vector<std::string>{sha});
  EXPECT_EQ(Upload(digest::Sha256Hex("other"), data, data.size()).code(), StatusCode::kDataLoss);
  EXPECT_EQ(Upload(sha, data, data.size() + 1).code(), StatusCode::kDataLoss);
  EXPECT_EQ(Upload(sha, data, data.size() - 1).code(), StatusCode::kDataLoss);
  EXPECT_TRUE(DirEmpty("blobs"));
  EXPECT_TRUE(DirEmpty("tmp"));
  ASSERT_TRUE(Upload(sha, data, data.size()).ok());
  EXPECT_TRUE(cache_->MissingBlobs({sha})->empty());
  EXPECT_TRUE(DirEmpty("tmp"));
  EXPECT_EQ(cache_->MissingBlobs({"ABC"}).status().code(), StatusCode::kInvalidArgument);
}

// llm-train keeps its token files in the cache (LLMCTL_CACHE_DIR) and refuses one that other users
// may write, where they could plant tokens to be trained on: under umask 000 the cache was made
// 0777 and every trial failed. One made that way before is refused when the agent starts.
TEST_F(InputCacheTest, ItsDirectoriesAreWritableByTheAgentAloneWhateverTheUmask) {
  const fs::path made = dir_ / "made-under-umask-000";
  const mode_t umask_was = ::umask(0);
  auto cache = InputCache::Open(made.string());
  ::umask(umask_was);
  ASSERT_TRUE(cache.ok()) << cache.status().ToString();
  constexpr fs::perms kOthersWrite = fs::perms::group_write | fs::perms::others_write;
  for (const fs::path& dir : {made, made / "blobs", made / "trees", made / "tmp"}) {
    EXPECT_EQ(fs::status(dir).permissions() & kOthersWrite, fs::perms::none) << dir;
  }

  fs::permissions(made, fs::perms::all);
  const Status refused = InputCache::Open(made.string()).status();
  EXPECT_EQ(refused.code(), StatusCode::kFailedPrecondition);
  EXPECT_TRUE(refused.message().starts_with(made.string())) << refused.message();
}

TEST_F(InputCacheTest, AnUploadThatWouldFillTheDiskIsRefusedBeforeItsFirstByte) {
  const fs::path full_dir = FreshDir("full-cache");
  // Everything the filesystem has is to be kept free: no upload fits, however small.
  auto full = InputCache::Open(full_dir.string(), std::numeric_limits<int64_t>::max());
  ASSERT_TRUE(full.ok());
  const std::string sha = digest::Sha256Hex("x");
  const Status refused = (*full)->BeginUpload(sha, 1).status();
  EXPECT_EQ(refused.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(refused.message().find("upload of " + sha + ": 1 B do not fit in " +
                                   (full_dir / "tmp").string()),
            std::string::npos)
      << refused.message();
  EXPECT_TRUE(fs::is_empty(full_dir / "tmp"));
  fs::remove_all(full_dir);
}

TEST_F(InputCacheTest, TreesAreCheckedThenLinked) {
  const std::string a = "alpha\n", b = "beta\n";
  ASSERT_TRUE(Upload(digest::Sha256Hex(a), a, a.size()).ok());
  digest::InputTree tree;
  tree.files = {{"a.txt", digest::Sha256Hex(a), static_cast<int64_t>(a.size())},
                {"sub/b.txt", digest::Sha256Hex(b), static_cast<int64_t>(b.size())}};
  tree.digest = digest::TreeDigest(tree.files);
  // The digest rule from common.proto, written out by hand.
  EXPECT_EQ(tree.digest, digest::Sha256Hex(digest::Sha256Hex(a) + " 6 a.txt\n" +
                                           digest::Sha256Hex(b) + " 5 sub/b.txt\n"));

  auto incomplete = cache_->Materialize(tree);
  EXPECT_EQ(incomplete.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(incomplete.status().message().find(digest::Sha256Hex(b)), std::string::npos);
  ASSERT_TRUE(Upload(digest::Sha256Hex(b), b, b.size()).ok());
  auto path = cache_->Materialize(tree);
  ASSERT_TRUE(path.ok()) << path.status().ToString();
  std::ifstream in(*path + "/sub/b.txt");
  std::string line;
  std::getline(in, line);
  EXPECT_EQ(line, "beta");
  EXPECT_EQ(*cache_->Materialize(tree), *path) << "a second call finds the tree in place";

  digest::InputTree wrong = tree;
  wrong.digest = digest::Sha256Hex("x");
  EXPECT_EQ(cache_->Materialize(wrong).status().code(), StatusCode::kInvalidArgument);
  for (const std::string bad : {"../etc/passwd", "/etc/passwd", "a/../../b", "a//b", "./a"}) {
    digest::InputTree evil;
    evil.files = {{bad, digest::Sha256Hex(a), static_cast<int64_t>(a.size())}};
    evil.digest = digest::TreeDigest(evil.files);
    auto refused = cache_->Materialize(evil);
    EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(refused.status().message().find(bad), std::string::npos)
        << refused.status().message();
  }
  digest::InputTree clash;
  clash.files = {{"a", digest::Sha256Hex(a), 6}, {"a/b", digest::Sha256Hex(b), 5}};
  clash.digest = digest::TreeDigest(clash.files);
  EXPECT_EQ(cache_->Materialize(clash).status().code(), StatusCode::kInvalidArgument);

  digest::InputTree single;
  single.is_file = true;
  single.files = {{"data.jsonl", digest::Sha256Hex(a), 6}};
  single.digest = digest::TreeDigest(single.files);
  auto file = cache_->Materialize(single);
  ASSERT_TRUE(file.ok());
  EXPECT_TRUE(fs::is_regular_file(*file));
  EXPECT_EQ(fs::path(*file).filename(), "data.jsonl");
  EXPECT_TRUE(DirEmpty("tmp"));
}

TEST(ProcessTest, ExitWatchIsReadableOnceTheProcessHasExited) {
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::pause();  // until killed
    ::_exit(0);
  }
  const std::optional<uint64_t> start_time = ProcessStartTime(child);
  ASSERT_TRUE(start_time.has_value());
  EXPECT_FALSE(OpenExitWatch(child, *start_time + 1).valid()) << "another process's start time";
  UniqueFd watch = OpenExitWatch(child, *start_time);
  ASSERT_TRUE(watch.valid()) << "pidfd_open is refused here";
  pollfd exited{watch.get(), POLLIN, 0};
  EXPECT_EQ(::poll(&exited, 1, 0), 0) << "readable while the process runs";

  ::kill(child, SIGKILL);
  EXPECT_EQ(::poll(&exited, 1, 60 * 1000), 1);
  EXPECT_TRUE(exited.revents & POLLIN);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  EXPECT_FALSE(OpenExitWatch(child, *start_time).valid()) << "the process is gone";
}

// A program's output and exit code; one that closes its standard output and then hangs is still
// killed at the timeout (its end of output is not its end).
TEST(ProcessTest, RunCommandHoldsAProgramToItsTimeoutAfterItsOutputCloses) {
  StatusOr<CommandOutput> said =
      RunCommand({"sh", "-c", "echo hi; echo why >&2; exit 3"}, std::chrono::seconds(60));
  ASSERT_TRUE(said.ok()) << said.status().ToString();
  EXPECT_EQ(said->stdout_text, "hi\n");
  EXPECT_EQ(said->stderr_tail, "why\n");
  EXPECT_EQ(said->exit_code, 3);

  // Without the deadline after EOF this call would wait out the 600 s sleep, past the test's
  // ctest timeout.
  StatusOr<CommandOutput> hung = RunCommand(
      {"sh", "-c", "echo part; exec 1>&- 2>&-; exec sleep 600"}, std::chrono::milliseconds(300));
  ASSERT_TRUE(hung.ok()) << hung.status().ToString();
  EXPECT_EQ(hung->stdout_text, "part\n");
  EXPECT_EQ(hung->exit_code, -1);

  EXPECT_EQ(RunCommand({"/no/such/program"}, std::chrono::seconds(1)).status().code(),
            StatusCode::kNotFound);
}

// The agent blocks SIGINT and SIGTERM in every thread (for sigwait) and a mask survives exec: a
// command it runs (llm-train --version, the rate probe) starts with none blocked or ignored, or a
// SIGTERM sent to it (a user's pkill, the node's shutdown) would do nothing.
TEST(ProcessTest, RunCommandStartsTheProgramWithNoSignalBlockedOrIgnored) {
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  sigset_t before;
  ASSERT_EQ(::pthread_sigmask(SIG_BLOCK, &stop_signals, &before), 0);
  struct sigaction ignore {};
  ignore.sa_handler = SIG_IGN;
  struct sigaction hup_before {};
  ASSERT_EQ(::sigaction(SIGHUP, &ignore, &hup_before), 0);
  StatusOr<CommandOutput> status = RunCommand(
      {"sh", "-c", "exec grep -E '^Sig(Blk|Ign):' /proc/self/status"}, std::chrono::seconds(60));
  ::sigaction(SIGHUP, &hup_before, nullptr);
  ::pthread_sigmask(SIG_SETMASK, &before, nullptr);
  ASSERT_TRUE(status.ok()) << status.status().ToString();
  std::istringstream lines(status->stdout_text);
  std::string blocked_label, blocked_hex, ignored_label, ignored_hex;
  lines >> blocked_label >> blocked_hex >> ignored_label >> ignored_hex;
  ASSERT_EQ(ignored_label, "SigIgn:") << status->stdout_text;
  EXPECT_EQ(std::stoull(blocked_hex, nullptr, 16), 0u) << status->stdout_text;
  const uint64_t ignored = std::stoull(ignored_hex, nullptr, 16);
  for (int signal : {SIGHUP, SIGINT, SIGTERM}) {  // bit signal - 1 of the mask
    EXPECT_EQ(ignored & (uint64_t{1} << (signal - 1)), 0u) << "signal " << signal;
  }
}

// A command is killed with the agent (SIGKILL, a crash): a rate probe left running would measure
// the machine beside the restarted agent's own probe, and both would store half its rates.
TEST(ProcessTest, RunCommandsProgramDiesWithTheAgent) {
  const fs::path dir = FreshDir("dies_with_agent");
  const std::string pid_file = (dir / "pid").string();
  const pid_t agent = ::fork();
  ASSERT_GE(agent, 0);
  if (agent == 0) {
    (void)RunCommand({"sh", "-c", "echo $$ > " + pid_file + "; exec sleep 600"},
                     std::chrono::seconds(600));
    ::_exit(0);
  }
  pid_t command = 0;
  for (int tries = 0; tries < 1000 && command == 0; ++tries) {
    std::ifstream in(pid_file);
    std::string line;
    if (std::getline(in, line) && in.good()) {
      command = std::stoi(line);  // a whole line: the shell has written all of it
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  ::kill(agent, SIGKILL);
  int status = 0;
  ASSERT_EQ(::waitpid(agent, &status, 0), agent);
  ASSERT_GT(command, 0) << "the command never wrote " << pid_file;
  bool gone = false;
  for (int tries = 0; tries < 1000 && !gone; ++tries) {
    gone = !ProcessStartTime(command).has_value();  // a zombie left for init counts as gone
    if (!gone) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_TRUE(gone) << "the command (pid " << command << ") outlived the agent";
  if (!gone) ::kill(-command, SIGKILL);
  fs::remove_all(dir);
}

TEST(NodeInfoTest, ParsesMeminfo) {
  EXPECT_EQ(*ParseMemTotal("MemFree: 1 kB\nMemTotal:       16384 kB\n"), 16384 * 1024);
  EXPECT_FALSE(ParseMemTotal("MemFree: 1 kB\n").ok());
}

// A MemTotal whose bytes pass int64 overflowed kib * 1024 (undefined behaviour; found by
// tests/fuzz/run_files_fuzz.cc), and a negative one was a host with negative memory.
TEST(NodeInfoTest, RefusesAMemTotalNoMachineHas) {
  constexpr int64_t kMaxKib = std::numeric_limits<int64_t>::max() / 1024;
  EXPECT_EQ(*ParseMemTotal("MemTotal: " + std::to_string(kMaxKib) + " kB\n"), kMaxKib * 1024);
  EXPECT_EQ(*ParseMemTotal("MemTotal: 0 kB\n"), 0);
  for (const std::string& meminfo :
       {std::string("MemTotal: -5 kB\n"), "MemTotal: " + std::to_string(kMaxKib + 1) + " kB\n",
        std::string("MemTotal: 9223372036854775807 kB\n")}) {
    const StatusOr<int64_t> total = ParseMemTotal(meminfo);
    ASSERT_FALSE(total.ok()) << meminfo << " read as " << *total;
    EXPECT_EQ(total.status().code(), StatusCode::kInvalidArgument);
  }
}

// The supervisor adds its grace to the steady clock's now in nanoseconds: a grace near int64's
// end of milliseconds overflowed there (found by run_files_fuzz.cc). It is refused, and the agent's
// own flag is bounded alike.
TEST(SupervisorTest, RefusesAGraceItCannotAddToItsClock) {
  const SupervisorCommand longest{"/r", kMaxSupervisorGrace, {"/bin/true", "a"}};
  const StatusOr<SupervisorCommand> parsed =
      ParseSupervisorArgs(SupervisorArgv("llm-agent", longest));
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  EXPECT_EQ(parsed->grace, kMaxSupervisorGrace);
  EXPECT_EQ(parsed->run_dir, "/r");
  EXPECT_EQ(parsed->worker_argv, longest.worker_argv);
  for (const std::string& grace :
       {std::to_string(kMaxSupervisorGrace.count() + 1), std::string("9223372036854775807")}) {
    const StatusOr<SupervisorCommand> refused = ParseSupervisorArgs(
        {"llm-agent", kSuperviseFlag, "/r", "--grace-ms", grace, "--", "/bin/true"});
    ASSERT_FALSE(refused.ok()) << grace;
    EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(refused.status().message(), "--grace-ms " + grace + ": at most 2147483647 ms");
  }
}

// llm-agent's log lines begin with their time in UTC with its Z, then their level, as llmctld's do,
// whatever TZ says: here the line of a supervisor given no run (the real llm-agent, under a zone
// 5 h 30 min east of UTC), a refusal that ends it and so an error.
TEST(SupervisorTest, ItsRefusalIsAnErrorLineBeginningWithItsTimeInUtc) {
  const StatusOr<CommandOutput> refused = RunCommand(
      {"env", "TZ=IST-5:30", (llmctl::testing::BuildDir() / "agent" / "llm-agent").string(),
       std::string(kSuperviseFlag)},
      std::chrono::seconds(60));
  ASSERT_TRUE(refused.ok()) << refused.status().ToString();
  EXPECT_TRUE(std::regex_match(
      refused->stderr_tail,
      std::regex(R"(\[\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z\] \[error\] llm-agent: [^\n]+\n)")))
      << refused->stderr_tail;
}

// The flags llm-agent needs, naming files in `dir`: a CA's certificate, a certificate and key for
// node "local" and a token (0600), its data directory and an llm-train that runs.
std::vector<std::string> AgentFlags(const fs::path& dir) {
  StatusOr<std::unique_ptr<rpc::CertificateAuthority>> ca =
      rpc::CertificateAuthority::LoadOrCreate((dir / "ca").string());
  EXPECT_TRUE(ca.ok()) << ca.status().ToString();
  if (!ca.ok()) return {};
  StatusOr<rpc::IssuedCertificate> issued = (*ca)->Issue(rpc::AgentCertificateName("local"), 1);
  EXPECT_TRUE(issued.ok()) << issued.status().ToString();
  if (!issued.ok()) return {};
  const std::pair<const char*, std::string> files[] = {{"ca.crt", (*ca)->ca_certificate_pem()},
                                                       {"agent.crt", issued->certificate_pem},
                                                       {"agent.key", issued->private_key_pem},
                                                       {"token", "a-token-for-this-test"}};
  for (const auto& [name, text] : files) {
    std::ofstream(dir / name) << text;
    fs::permissions(dir / name, fs::perms::owner_read | fs::perms::owner_write);
  }
  return {"--data-dir",   (dir / "data").string(),
          "--node",       "local",
          "--ca",         (dir / "ca.crt").string(),
          "--cert",       (dir / "agent.crt").string(),
          "--key",        (dir / "agent.key").string(),
          "--token-file", (dir / "token").string(),
          "--llm-train",  "/bin/true"};
}

// The real llm-agent with `flags`, its rate probe off: its exit code and what it wrote.
StatusOr<CommandOutput> RunAgent(const std::vector<std::string>& flags) {
  std::vector<std::string> argv = {"env", "LLMCTL_RATE_PROBE=off",
                                   (llmctl::testing::BuildDir() / "agent" / "llm-agent").string()};
  argv.insert(argv.end(), flags.begin(), flags.end());
  return RunCommand(argv, std::chrono::seconds(60));
}

// A --listen path that is not a socket is the agent's configuration, refused as its flags and files
// are (common/daemon_exit.h's 2, which llmctl reports as the user's to fix): it exited 1, as when
// it could not serve.
TEST(AgentMainTest, AListenPathThatIsNotASocketIsARefusedConfiguration) {
  const fs::path dir = FreshDir("listen_not_socket");
  std::vector<std::string> flags = AgentFlags(dir);
  ASSERT_FALSE(flags.empty());
  std::ofstream(dir / "agent.sock") << "a file";
  flags.insert(flags.end(), {"--listen", "unix:" + (dir / "agent.sock").string()});
  const StatusOr<CommandOutput> refused = RunAgent(flags);
  ASSERT_TRUE(refused.ok()) << refused.status().ToString();
  EXPECT_EQ(refused->exit_code, 2) << refused->stderr_tail;
  EXPECT_NE(
      refused->stderr_tail.find((dir / "agent.sock").string() + " exists and is not a socket"),
      std::string::npos)
      << refused->stderr_tail;
  EXPECT_TRUE(fs::is_regular_file(dir / "agent.sock"));
  fs::remove_all(dir);
}

// A certificate renewal a crash interrupted that cannot be finished (its <key>.next cannot be
// removed: here a directory with a file in it) is this machine's failure (1), not a refused flag:
// it exited 2, CLI11's code for bad flags.
TEST(AgentMainTest, ARenewalThatCannotBeFinishedIsThisMachinesFailure) {
  const fs::path dir = FreshDir("renewal_not_finished");
  std::vector<std::string> flags = AgentFlags(dir);
  ASSERT_FALSE(flags.empty());
  fs::create_directories(dir / "agent.key.next");
  std::ofstream(dir / "agent.key.next" / "in-the-way") << "x";
  flags.insert(flags.end(), {"--listen", "unix:" + (dir / "agent.sock").string()});
  const StatusOr<CommandOutput> failed = RunAgent(flags);
  ASSERT_TRUE(failed.ok()) << failed.status().ToString();
  EXPECT_EQ(failed->exit_code, 1) << failed->stderr_tail;
  EXPECT_NE(failed->stderr_tail.find("cannot remove " + (dir / "agent.key.next").string()),
            std::string::npos)
      << failed->stderr_tail;
  EXPECT_FALSE(fs::exists(dir / "agent.sock"));
  fs::remove_all(dir);
}

// An agent of node "local" listening on DIR/sockets/`socket` with its data in DIR/`data`, its
// credentials from a CA in DIR/ca, and no trainer to run.
AgentOptions LocalAgentOptions(const fs::path& dir, const std::string& socket = "agent.sock",
                               const std::string& data = "data") {
  StatusOr<std::unique_ptr<rpc::CertificateAuthority>> ca =
      rpc::CertificateAuthority::LoadOrCreate((dir / "ca").string());
  EXPECT_TRUE(ca.ok()) << ca.status().ToString();
  if (!ca.ok()) return {};
  StatusOr<rpc::IssuedCertificate> issued = (*ca)->Issue(rpc::AgentCertificateName("local"), 1);
  EXPECT_TRUE(issued.ok()) << issued.status().ToString();
  if (!issued.ok()) return {};
  fs::create_directories(dir / "sockets");
  AgentOptions options;
  options.listen = "unix:" + (dir / "sockets" / socket).string();
  options.data_dir = (dir / data).string();
  options.node = "local";
  options.identity = {(*ca)->ca_certificate_pem(), issued->certificate_pem,
                      issued->private_key_pem};
  options.token = "a-token-for-this-test";
  options.llm_train = "/bin/true";
  options.supervisor_program = "/bin/true";
  return options;
}

// The agent's unix socket is the owner's alone from its bind, whatever the umask: it was made 0777
// less the umask (0777 under umask 000) and made private after, a moment in which others could
// connect and llmctl's start took the agent for ready, though the agent could still fail to make it
// private. inotify sees each change to the socket's mode: none may follow its creation.
TEST(AgentServerTest, AUnixSocketIsTheOwnersAloneFromItsBind) {
  const fs::path dir = FreshDir("private_socket");
  const AgentOptions options = LocalAgentOptions(dir);
  ASSERT_FALSE(options.listen.empty());
  const int watch = ::inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
  ASSERT_GE(watch, 0);
  ASSERT_GE(::inotify_add_watch(watch, (dir / "sockets").c_str(), IN_CREATE | IN_ATTRIB), 0);
  const mode_t umask_before = ::umask(0);
  StatusOr<std::unique_ptr<AgentServer>> server = AgentServer::Start(options);
  ::umask(umask_before);
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  std::vector<std::string> events;
  alignas(inotify_event) char buffer[4096];
  for (ssize_t got; (got = ::read(watch, buffer, sizeof buffer)) > 0;) {
    for (ssize_t at = 0; at < got;) {
      const auto* event = reinterpret_cast<const inotify_event*>(buffer + at);
      events.push_back(std::string(event->mask & IN_CREATE ? "create " : "attrib ") +
                       (event->len > 0 ? event->name : ""));
      at += static_cast<ssize_t>(sizeof(inotify_event) + event->len);
    }
  }
  ::close(watch);
  EXPECT_EQ(events, std::vector<std::string>{"create agent.sock"});
  EXPECT_EQ(fs::status(dir / "sockets" / "agent.sock").permissions() &
                (fs::perms::group_all | fs::perms::others_all),
            fs::perms::none);
  server->reset();
  fs::remove_all(dir);
}

// One agent to a data directory: a second one there, even on another socket, would take the
// first's socket (an agent removes the one at its listen path) and recover and supervise the same
// runs. It is refused, naming the first's pid, and the first keeps serving; once the first has
// ended, an agent starts there again.
TEST(AgentServerTest, ASecondAgentOnTheSameDataDirectoryIsRefused) {
  const fs::path dir = FreshDir("second_agent");
  const AgentOptions first_options = LocalAgentOptions(dir);
  ASSERT_FALSE(first_options.listen.empty());
  StatusOr<std::unique_ptr<AgentServer>> first = AgentServer::Start(first_options);
  ASSERT_TRUE(first.ok()) << first.status().ToString();

  StatusOr<std::unique_ptr<AgentServer>> second =
      AgentServer::Start(LocalAgentOptions(dir, "second.sock"));
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(second.status().message(), "another llm-agent (pid " + std::to_string(::getpid()) +
                                           ") is using the data directory " +
                                           first_options.data_dir +
                                           "; stop it, or give this one another --data-dir");
  EXPECT_TRUE(fs::is_socket(dir / "sockets" / "agent.sock"));
  EXPECT_FALSE(fs::exists(dir / "sockets" / "second.sock"));

  first->reset();
  StatusOr<std::unique_ptr<AgentServer>> again = AgentServer::Start(first_options);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  again->reset();
  fs::remove_all(dir);
}

// exit.json read back: a signal of 0 or 2^32 read as a clean exit, 2^32 + 9 as SIGKILL (the
// kernel's OOM killer), an exit code of 2^32 as 0 (found by run_files_fuzz.cc). What the
// supervisor never writes is DataLoss, as a file that does not parse is.
TEST(SupervisorTest, AnExitFileOutsideItsRangesIsDataLoss) {
  const fs::path dir = FreshDir("exit_json");
  const auto read = [&](const std::string& text) {
    std::ofstream(dir / kExitFile) << text;
    return ReadWorkerExit(dir.string());
  };
  const StatusOr<std::optional<WorkerExit>> killed = read(R"({"signal":9})");
  ASSERT_TRUE(killed.ok() && killed->has_value());
  EXPECT_EQ((*killed)->signal, 9);
  const StatusOr<std::optional<WorkerExit>> failed = read(R"({"exit_code":255})");
  ASSERT_TRUE(failed.ok() && failed->has_value());
  EXPECT_EQ((*failed)->exit_code, 255);
  EXPECT_EQ((*failed)->signal, 0);
  for (const char* text :
       {R"({"signal":0})", R"({"signal":4294967296})", R"({"signal":4294967305})",
        R"({"signal":-9})", R"({"signal":65,"exit_code":0})", R"({"exit_code":4294967296})",
        R"({"exit_code":-1})", R"({"exit_code":256})", R"({"exit_code":18446744073709551615})"}) {
    const StatusOr<std::optional<WorkerExit>> exit = read(text);
    ASSERT_FALSE(exit.ok()) << text << " read as exit code " << (*exit)->exit_code << ", signal "
                            << (*exit)->signal;
    EXPECT_EQ(exit.status().code(), StatusCode::kDataLoss);
    EXPECT_NE(exit.status().message().find("exit.json does not say how the worker ended"),
              std::string::npos)
        << exit.status().message();
  }
  // What the file holds is quoted on one line, cut at a character's start: no escape sequence, and
  // no 'é' split at the 200th byte into bytes that break UTF-8.
  const StatusOr<std::optional<WorkerExit>> hostile =
      read("{\"signal\":\"\x1b]0;T\x07\n" + std::string(182, 'x') + "\xc3\xa9\"}");
  ASSERT_FALSE(hostile.ok());
  EXPECT_EQ(hostile.status().message().find_first_of("\x1b\x07\n"), std::string::npos)
      << hostile.status().message();
  EXPECT_EQ(FirstInvalidUtf8(hostile.status().message()), std::string_view::npos)
      << hostile.status().message();
}

// The hub's answers apart from HTTP (agent/hub_listing.h; tests/fuzz/hub_listing_fuzz.cc tries
// any bytes): what a listing keeps, and refusals that name the model and the file.
TEST(HubListingTest, KeepsSizesAndDigestsAndRefusesWhatIsNoListing) {
  const std::string sha256(64, 'a');
  const StatusOr<HubListing> listing =
      ParseHubListing(R"({"sha":"0123456789abcdef0123456789abcdef01234567","siblings":[)"
                      R"({"rfilename":"config.json","size":665,"blobId":"b0"},)"
                      R"({"rfilename":"model.safetensors","size":135,"lfs":{"sha256":")" +
                          sha256 + R"(","size":547713960}}]})",
                      "m");
  ASSERT_TRUE(listing.ok()) << listing.status().ToString();
  EXPECT_EQ(listing->commit, "0123456789abcdef0123456789abcdef01234567");
  EXPECT_EQ(listing->files.at("config.json").size, 665);
  EXPECT_EQ(listing->files.at("config.json").git_blob_id, "b0");
  EXPECT_EQ(listing->files.at("model.safetensors").size, 547713960);
  EXPECT_EQ(listing->files.at("model.safetensors").lfs_sha256, sha256);
  for (const char* bad :
       {"", "[]", R"({"sha":"0123","siblings":[]})",
        R"({"sha":"0123456789abcdef0123456789abcdef01234567","siblings":[{"rfilename":"a"}]})",
        R"({"sha":"0123456789abcdef0123456789abcdef01234567","siblings":[)"
        R"({"rfilename":"a","size":9223372036854775808}]})"}) {
    const StatusOr<HubListing> refused = ParseHubListing(bad, "m");
    ASSERT_FALSE(refused.ok()) << bad;
    EXPECT_EQ(refused.status().code(), StatusCode::kDataLoss);
    EXPECT_EQ(refused.status().message().rfind("m: the hub's answer is not a model listing: ", 0),
              0u)
        << refused.status().message();
  }

  const StatusOr<std::vector<std::string>> shards =
      ParseIndexShards(R"({"weight_map":{"b":"model-2.safetensors","a":"model-1.safetensors",)"
                       R"("c":"model-1.safetensors"}})",
                       "m");
  ASSERT_TRUE(shards.ok()) << shards.status().ToString();
  EXPECT_EQ(*shards, (std::vector<std::string>{"model-1.safetensors", "model-2.safetensors"}));
  for (const char* bad : {R"({"weight_map":{}})", R"({"weight_map":{"a":"../x"}})",
                          R"({"weight_map":{"a":"/etc/x"}})", R"({"weight_map":{"a":"x//y"}})"}) {
    const StatusOr<std::vector<std::string>> refused = ParseIndexShards(bad, "m");
    ASSERT_FALSE(refused.ok()) << bad;
    EXPECT_EQ(refused.status().code(), StatusCode::kDataLoss);
    EXPECT_EQ(refused.status().message().rfind("m: model.safetensors.index.json", 0), 0u);
  }
}

// A file's name in the hub's listing is the hub's: quoted in a refusal, which becomes the trial's
// error on every terminal that shows it, it holds no escape sequence, BEL or C1 control.
TEST(HubListingTest, ARefusalQuotesTheHubsFileNameOnOneLine) {
  const StatusOr<HubListing> refused =
      ParseHubListing(R"({"sha":"0123456789abcdef0123456789abcdef01234567","siblings":[)"
                      R"({"rfilename":"w\u001b]0;HUBTITLE\u0007\u001b[31mRED\n\u009b2J.bin"}]})",
                      "m");
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().message(),
            "m: the hub's answer is not a model listing: w ]0;HUBTITLE  [31mRED  2J.bin has no "
            "size (a non-negative integer)");
  const StatusOr<std::vector<std::string>> shards =
      ParseIndexShards(R"({"weight_map":{"t\u001b[2J":"../x"}})", "m");
  ASSERT_FALSE(shards.ok());
  EXPECT_EQ(shards.status().message().find('\x1b'), std::string::npos) << shards.status().message();
}

nvml::FakeGpuProbe TwoGpus() {
  nvml::FakeGpu h100;
  h100.memory.total_bytes = int64_t{81559} << 20;
  nvml::FakeGpu a100;
  a100.name = "NVIDIA A100-SXM4-80GB";
  a100.memory.total_bytes = int64_t{81920} << 20;
  return nvml::FakeGpuProbe({h100, a100}, "550.54.15", {12, 4});
}

TEST(NodeInfoTest, GpusAndTheDriverComeFromNvml) {
  nvml::FakeGpuProbe gpus = TwoGpus();
  const StatusOr<NodeFacts> probed = ProbeNode("/nonexistent/llm-train", &gpus);
  ASSERT_TRUE(probed.ok()) << probed.status().ToString();
  const NodeFacts& facts = *probed;
  ASSERT_EQ(facts.devices.size(), 2u);
  EXPECT_EQ(facts.devices[0].type, "cuda");
  EXPECT_EQ(facts.devices[0].name, "NVIDIA H100 80GB HBM3");
  EXPECT_EQ(facts.devices[1].index, 1);
  EXPECT_EQ(facts.devices[1].name, "NVIDIA A100-SXM4-80GB");
  EXPECT_EQ(facts.devices[1].memory_bytes, int64_t{81920} * 1024 * 1024);
  EXPECT_EQ(facts.nvidia_driver_version, "550.54.15");
  EXPECT_EQ(facts.driver_cuda_version, "12.4");
  EXPECT_EQ(facts.trainer_version, "");
  EXPECT_EQ(facts.libtorch_cuda_version, "");
}

TEST(NodeInfoTest, WithoutNvmlTheNodeIsOneCpu) {
  const StatusOr<NodeFacts> probed = ProbeNode("/nonexistent/llm-train", nullptr);
  ASSERT_TRUE(probed.ok()) << probed.status().ToString();
  const NodeFacts& facts = *probed;
  EXPECT_GT(facts.cpu_count, 0);
  EXPECT_GT(facts.host_memory_bytes, 0);
  ASSERT_EQ(facts.devices.size(), 1u);
  EXPECT_EQ(facts.devices[0].type, "cpu");
  EXPECT_EQ(facts.devices[0].memory_bytes, facts.host_memory_bytes);
  EXPECT_EQ(facts.nvidia_driver_version, "");
  EXPECT_EQ(facts.driver_cuda_version, "");
}

TEST(NodeInfoTest, ListingStopsAtNvmlsError) {
  nvml::FakeGpuProbe gpus({});
  EXPECT_TRUE(ListGpus(gpus)->empty());
  nvml::FakeGpu lost;
  lost.lost = true;
  nvml::FakeGpuProbe second_lost({nvml::FakeGpu{}, lost});
  EXPECT_EQ(ListGpus(second_lost).status().message(),
            "NVML nvmlDeviceGetName(device 1): GPU is lost");
}

// The agent reads llm-train --version --json; the summary line stays what reports name it by.
TEST(NodeInfoTest, TrainerVersionsComeFromItsJson) {
  const fs::path dir = FreshDir("node_info");
  const fs::path trainer = dir / "llm-train";
  {
    std::ofstream script(trainer);
    script << "#!/bin/sh\n"
              "[ \"$1 $2\" = \"--version --json\" ] || exit 9\n"
              "echo '{\"llmctl\": \"0.4.0\", \"libtorch\": \"2.15.0\", "
              "\"libtorch_cuda\": \"13.2\", \"cuda_devices\": 0}'\n";
  }
  fs::permissions(trainer, fs::perms::owner_all);
  nvml::FakeGpuProbe gpus = TwoGpus();
  const StatusOr<NodeFacts> probed = ProbeNode(trainer.string(), &gpus);
  ASSERT_TRUE(probed.ok()) << probed.status().ToString();
  const NodeFacts& facts = *probed;
  EXPECT_EQ(facts.trainer_version, "llm-train 0.4.0 (LibTorch 2.15.0, no CUDA device)");
  EXPECT_EQ(facts.libtorch_version, "2.15.0");
  EXPECT_EQ(facts.libtorch_cuda_version, "13.2");
  fs::remove_all(dir);
}

// The agent stopping (SIGTERM) while llm-train --version runs at its start: the trainer's process
// group is killed and the probe ends Cancelled, instead of the agent waiting out the probe's
// 20-second timeout.
TEST(NodeInfoTest, StoppingEndsTheTrainersVersionProbe) {
  const fs::path dir = FreshDir("node_info_stop");
  const fs::path trainer = dir / "llm-train";
  const fs::path pid_file = dir / "helper.pid";
  // A trainer that hangs in a helper process of its own, whose pid it writes.
  std::ofstream(trainer) << "#!/bin/sh\nsleep 60 &\necho $! > '" << pid_file.string()
                         << "'\nwait\n";
  fs::permissions(trainer, fs::perms::owner_all);
  std::stop_source stop;
  std::thread stopper([&] {
    StatusOr<std::string> pid_text = NotFoundError("");
    while (!(pid_text = ReadFileToString(pid_file.string(), 64)).ok() ||
           !pid_text->ends_with("\n")) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    stop.request_stop();
  });
  const auto started = std::chrono::steady_clock::now();
  const StatusOr<NodeFacts> probed = ProbeNode(trainer.string(), nullptr, stop.get_token());
  stopper.join();
  EXPECT_EQ(probed.status().code(), StatusCode::kCancelled) << probed.status().ToString();
  // Sanity only: the probe's own timeout is 20 s.
  EXPECT_LT(std::chrono::steady_clock::now() - started, std::chrono::seconds(15));
  // The helper went with its group: gone, or a zombie until init reaps it (no start time then).
  const pid_t helper = std::stoi(*ReadFileToString(pid_file.string(), 64));
  for (int i = 0; i < 200 && ProcessStartTime(helper).has_value(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_FALSE(ProcessStartTime(helper).has_value()) << "the trainer's helper outlived the probe";
  fs::remove_all(dir);
}

}  // namespace
}  // namespace llmctl::agent
