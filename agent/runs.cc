#include "agent/runs.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <type_traits>

#include "agent/outcome.h"
#include "agent/process.h"
#include "agent/run_checks.h"
#include "agent/run_files.h"
#include "agent/run_launch.h"
#include "agent/supervisor.h"
#include "agent/trial_file.h"
#include "common/atomic_file.h"
#include "common/files.h"
#include "common/rank_files.h"
#include "common/trial_name.h"
#include "common/trial_outcome.h"

namespace llmctl::agent {
namespace {

namespace fs = std::filesystem;

constexpr size_t kStderrTailBytes = 64 * 1024;

// Whole-number directory names only ("3", not "03" or "x").
std::optional<int64_t> ParsePositive(const std::string& text) {
  if (text.empty() || text.size() > 18 || text[0] == '0' ||
      !std::all_of(text.begin(), text.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    return std::nullopt;
  }
  return std::stoll(text);
}

// The run's directory with its trial.yaml, devices.json and output/: assembled under a temporary
// name and renamed, so a half-made run is never found by a restarted agent.
Status CreateRunDir(const WorkerLaunch& launch) {
  const std::string& dir = launch.run_dir;
  const std::string staging = dir + ".new";
  std::error_code error;
  fs::remove_all(staging, error);
  // runs/ID/TRIAL/ATTEMPT.new/output, each 0700 whatever the umask.
  const fs::path trial_dir = fs::path(dir).parent_path();
  for (const std::string& level : {trial_dir.parent_path().string(), trial_dir.string(), staging,
                                   staging + "/" + kOutputDir}) {
    if (const Status made = EnsureOwnDirectory(level, 0700, OthersMay::kAnything); !made.ok()) {
      return UnavailableError(made.message());
    }
  }
  const std::string& yaml = launch.trial_file.yaml;
  RETURN_IF_ERROR(WriteFileAtomically(
      staging + "/" + kTrialFile, [&](int fd) { return WriteAll(fd, yaml.data(), yaml.size()); }));
  RETURN_IF_ERROR(
      WriteJsonFile(staging + "/" + kDevicesFile, {{"type", launch.trial_file.device},
                                                   {"indices", launch.device_indices},
                                                   {"ranks", launch.trial_file.ranks},
                                                   {"nodes", launch.group.nodes},
                                                   {"node_rank", launch.group.node_rank}}));
  if (::rename(staging.c_str(), dir.c_str()) != 0) {
    return UnavailableError("cannot create run directory " + dir + ": " + std::strerror(errno));
  }
  return Status::Ok();
}

}  // namespace

std::string RankEventsFile(int rank) { return RankEventsPath(kEventsFile, rank); }

std::string DescribeRunKey(const RunKey& key) {
  return "experiment " + std::to_string(key.experiment_id) + ", trial '" + key.trial +
         "', attempt " + std::to_string(key.attempt);
}

RunManager::RunManager(RunManagerOptions options, InputCache* cache)
    : options_(std::move(options)), cache_(cache) {}

StatusOr<std::unique_ptr<RunManager>> RunManager::Open(RunManagerOptions options,
                                                       InputCache* cache) {
  RETURN_IF_ERROR(EnsureOwnDirectory(options.data_dir + "/runs", 0700, OthersMay::kRead));
  std::unique_ptr<RunManager> manager(new RunManager(std::move(options), cache));
  manager->wake_watcher_ = UniqueFd(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!manager->wake_watcher_.valid()) {
    return UnavailableError(std::string("cannot create an eventfd: ") + std::strerror(errno));
  }
  RETURN_IF_ERROR(manager->Recover());
  manager->watcher_ = std::thread([m = manager.get()] { m->WatchLoop(); });
  return manager;
}

RunManager::~RunManager() {
  {
    MutexLock lock(mutex_);
    stopping_ = true;
  }
  ended_.NotifyAll();
  WakeWatcher();
  if (watcher_.joinable()) watcher_.join();
}

void RunManager::WakeWatcher() {
  const uint64_t one = 1;
  // Fails only when the counter is at its maximum: the watcher has a wake-up pending anyway.
  (void)!::write(wake_watcher_.get(), &one, sizeof(one));
}

std::string RunManager::RunDirFor(const RunKey& key) const {
  return options_.data_dir + "/runs/" + std::to_string(key.experiment_id) + "/" +
         EncodeTrialName(key.trial) + "/" + std::to_string(key.attempt);
}

namespace {

// The directories in `dir`, without an exception: an entry the system cannot look at (a link
// loop, a name too long) is left out, so one bad entry under runs/ cannot stop the agent's start.
std::vector<fs::path> SubDirectories(const fs::path& dir) {
  std::vector<fs::path> found;
  std::error_code error;
  for (fs::directory_iterator it(dir, error), end; !error && it != end; it.increment(error)) {
    std::error_code entry_error;
    if (it->is_directory(entry_error) && !entry_error) found.push_back(it->path());
  }
  return found;
}

}  // namespace

Status RunManager::Recover() {
  const fs::path runs_dir = options_.data_dir + "/runs";
  std::error_code error;
  const fs::directory_iterator scan(runs_dir, error);
  if (error) return UnavailableError("cannot scan " + runs_dir.string() + ": " + error.message());
  MutexLock lock(mutex_);
  for (const fs::path& experiment : SubDirectories(runs_dir)) {
    const auto experiment_id = ParsePositive(experiment.filename().string());
    if (!experiment_id) continue;
    for (const fs::path& trial : SubDirectories(experiment)) {
      const auto trial_name = DecodeTrialName(trial.filename().string());
      if (!trial_name) continue;
      for (const fs::path& attempt : SubDirectories(trial)) {
        const auto attempt_number = ParsePositive(attempt.filename().string());
        if (!attempt_number || *attempt_number > INT32_MAX) continue;
        const RunKey key{*experiment_id, *trial_name, static_cast<int32_t>(*attempt_number)};
        Run run;
        run.dir = attempt.string();
        if (auto devices = ReadJsonObject(run.dir + "/" + kDevicesFile)) {
          const nlohmann::json indices = devices->value("indices", nlohmann::json::array());
          if (devices->value("type", nlohmann::json()).is_string() && indices.is_array() &&
              std::all_of(indices.begin(), indices.end(),
                          [](const nlohmann::json& i) { return i.is_number_integer(); })) {
            run.device_type = devices->at("type").get<std::string>();
            run.device_indices = indices.get<std::vector<int>>();
          }
          const nlohmann::json ranks = devices->value("ranks", nlohmann::json(1));
          if (ranks.is_number_integer() && ranks.get<int64_t>() >= 1 &&
              ranks.get<int64_t>() <= kMaxRanks) {
            run.ranks = ranks.get<int>();
          }
          // A multi-node run's place: its ranks' global numbers and the world they are part of.
          const nlohmann::json nodes = devices->value("nodes", nlohmann::json(1));
          const nlohmann::json node_rank = devices->value("node_rank", nlohmann::json(0));
          if (nodes.is_number_integer() && node_rank.is_number_integer() &&
              nodes.get<int64_t>() >= 1 && nodes.get<int64_t>() <= kMaxRanks / run.ranks &&
              node_rank.get<int64_t>() >= 0 && node_rank.get<int64_t>() < nodes.get<int64_t>()) {
            run.nodes = nodes.get<int>();
            run.node_rank = node_rank.get<int>();
          }
        }
        if (auto ended = ReadJsonObject(run.dir + "/" + kEndedFile))
          run.end = RunEndFromJson(*ended);
        if (!run.end) {
          if (auto supervisor = ReadJsonObject(run.dir + "/" + kSupervisorFile)) {
            run.supervisor_pid = JsonFieldOr(*supervisor, "pid", 0);
            run.supervisor_start_time = JsonFieldOr(*supervisor, "start_time", uint64_t{0});
            const auto oom_kills = supervisor->find("oom_kills");
            if (oom_kills != supervisor->end() && oom_kills->is_number_unsigned()) {
              run.oom_kills_at_start = oom_kills->get<uint64_t>();
            }
          }
          CheckRun(run);  // re-adopted if alive, else ended from exit.json or as vanished
          if (!run.end) {
            run.supervisor_exit = OpenExitWatch(run.supervisor_pid, run.supervisor_start_time);
          }
        }
        runs_.emplace(key, std::move(run));
      }
    }
  }
  return Status::Ok();
}

void RunManager::WatchLoop() {
  std::vector<pollfd> watched;
  while (true) {
    watched.assign(1, pollfd{wake_watcher_.get(), POLLIN, 0});
    {
      MutexLock lock(mutex_);
      if (stopping_) return;
      for (auto& [key, run] : runs_) {
        if (!run.end) CheckRun(run);
        if (run.end) ReapSupervisor(run);
        // A supervisor writes exit.json before it exits, so a run may end while it still lives:
        // one this process started stays watched until it is reaped, or it would stay a zombie.
        if ((!run.end || run.is_child) && run.supervisor_exit.valid()) {
          watched.push_back(pollfd{run.supervisor_exit.get(), POLLIN, 0});
        }
      }
    }
    // Returns as soon as a supervisor exits (exit.json is written by then), a run starts or the
    // manager stops, so a run ends within milliseconds of its worker; the interval bounds how long
    // a run without an exit watch goes unchecked.
    ::poll(watched.data(), watched.size(), static_cast<int>(options_.poll_interval.count()));
    uint64_t wakeups;
    (void)!::read(wake_watcher_.get(), &wakeups, sizeof(wakeups));  // reset the counter
  }
}

void RunManager::ReapSupervisor(Run& run) {
  if (!run.is_child || run.supervisor_pid <= 0) return;
  int status = 0;
  const pid_t reaped = ::waitpid(run.supervisor_pid, &status, WNOHANG);
  // 0: still running. ECHILD: not this process's to reap after all; its exit watch, readable
  // from then on, must not stay in the poll.
  if (reaped == 0 || (reaped < 0 && errno != ECHILD)) return;
  run.is_child = false;
  if (run.end) run.supervisor_exit.reset();
}

void RunManager::CheckRun(Run& run) {
  ReapSupervisor(run);
  // Alive first: the supervisor writes exit.json before it exits, so a dead supervisor without
  // exit.json afterwards never wrote one.
  const bool alive =
      run.supervisor_pid > 0 && IsSameProcessAlive(run.supervisor_pid, run.supervisor_start_time);
  auto exit = ReadWorkerExit(run.dir);
  const bool cancel_requested = FileExists(run.dir + "/" + kCancelFile);
  if (exit.ok() && exit->has_value()) {
    const std::string stderr_tail = ReadTail(run.dir + "/" + kStderrFile, kStderrTailBytes);
    // Read once the run has ended, up to a poll interval after it (or after an agent restart): a
    // kill by the OOM killer of any process on the host meanwhile counts, as one during the run.
    const std::optional<uint64_t> oom_kills_now = ReadOomKillCount();
    const std::optional<uint64_t> oom_kills_during_run =
        run.oom_kills_at_start && oom_kills_now && *oom_kills_now >= *run.oom_kills_at_start
            ? std::optional<uint64_t>(*oom_kills_now - *run.oom_kills_at_start)
            : std::nullopt;
    // A multi-rank run ends as its first failed rank did, as the launcher recorded it by its
    // global rank (a cancel stops every rank: that is no rank's failure).
    const int first_rank = run.node_rank * run.ranks;
    const std::optional<RankExit> failed = (run.ranks > 1 || run.nodes > 1) && !cancel_requested &&
                                                   ((*exit)->signal != 0 || (*exit)->exit_code != 0)
                                               ? ReadFirstFailedRank(run.dir + "/" + kRanksFile)
                                               : std::nullopt;
    if (failed && failed->rank >= first_rank && failed->rank < first_rank + run.ranks) {
      const ResultEvent result = ReadResultEvent(run.dir + "/" + RankEventsFile(failed->rank));
      EndRun(run, DecideRankOutcome(*failed, run.nodes * run.ranks, result, cancel_requested,
                                    oom_kills_during_run, stderr_tail));
      return;
    }
    // The node's first rank's result (rank 0's, events.jsonl, unless this is node rank K > 0).
    const ResultEvent result = ReadResultEvent(run.dir + "/" + RankEventsFile(first_rank));
    EndRun(run, DecideOutcome(**exit, result, cancel_requested, oom_kills_during_run, stderr_tail));
    return;
  }
  if (alive) return;
  // The supervisor is gone without a word. Its worker may still run (the supervisor was killed):
  // stop it, nobody would ever collect its result.
  if (auto worker = ReadJsonObject(run.dir + "/" + kWorkerFile)) {
    const pid_t pid = JsonFieldOr(*worker, "pid", 0);
    if (pid > 0 && IsSameProcessAlive(pid, JsonFieldOr(*worker, "start_time", uint64_t{0}))) {
      // -0 and -1 would name the agent's own group and every process: only a real group.
      const pid_t pgid = JsonFieldOr(*worker, "pgid", pid);
      ::kill(pgid > 1 ? -pgid : pid, SIGKILL);
    }
  }
  RunEnd end;
  end.outcome = cancel_requested ? trial_outcome::kCancelled : trial_outcome::kFailed;
  end.error = "worker vanished: its supervisor ended without recording an exit status";
  if (!exit.ok()) end.error += " (" + exit.status().message() + ")";
  EndRun(run, end);
}

void RunManager::EndRun(Run& run, const RunEnd& end) {
  const Status written = WriteJsonFile(run.dir + "/" + kEndedFile, RunEndToJson(end));
  // Without ended.json the next start decides again from the same files, with the same result.
  (void)written;
  run.end = end;
  // A supervisor this process started keeps its watch until ReapSupervisor reaps it.
  if (!run.is_child) run.supervisor_exit.reset();
  ended_.NotifyAll();
}

RunState RunManager::StateOf(const RunKey& key, Run& run) const {
  RunState state;
  state.key = key;
  state.ended = run.end.has_value();
  if (run.end) state.end = *run.end;
  if (run.end && run.final_seq >= 0) {
    state.last_seq = run.final_seq;
  } else {
    // Under the lock, so only what was appended since the last look is read.
    CountNewLines(run.dir + "/" + kEventsFile, run.counted_bytes, run.counted_lines);
    state.last_seq = run.counted_lines;
    if (run.end) run.final_seq = state.last_seq;
  }
  if (run.nodes > 1 && run.node_rank == 0 && run.master_port == 0) {
    run.master_port = ReadMasterPort(run.dir + "/" + kRanksFile);
  }
  state.master_port = run.master_port;
  return state;
}

StatusOr<RunState> RunManager::Start(const RunRequest& request) {
  ASSIGN_OR_RETURN(RunState state, StartRun(request));
  // The other nodes' ranks need node rank 0's port to meet at, which its launcher chooses.
  auto deadline = std::chrono::steady_clock::now() + kMasterPortWait;
  if (request.answer_by != std::chrono::steady_clock::time_point()) {
    deadline = std::min(deadline, request.answer_by);
  }
  MutexLock lock(mutex_);
  auto it = runs_.find(request.key);
  if (it == runs_.end() || it->second.nodes <= 1 || it->second.node_rank != 0) return state;
  while (true) {
    state = StateOf(it->first, it->second);
    if (state.master_port > 0 || state.ended || stopping_ ||
        std::chrono::steady_clock::now() >= deadline) {
      return state;
    }
    // The launcher writes ranks.json without telling anyone: looked at each poll interval, and at
    // once when the run ends.
    ended_.WaitUntil(mutex_,
                     std::min(deadline, std::chrono::steady_clock::now() + options_.poll_interval));
  }
}

Status RunManager::CheckResumeCheckpoint(const RunKey& key, const RunKey& resume_run,
                                         const std::string& checkpoint) const {
  if (resume_run.experiment_id != key.experiment_id || resume_run.trial != key.trial) {
    return InvalidArgumentError("another trial's run; a trial resumes only from its own");
  }
  // The run's trial directory holds every attempt of the trial on this node.
  const fs::path trial_dir = fs::path(RunDirFor(resume_run)).parent_path();
  const fs::path in_trial = PathInside(checkpoint, trial_dir.string());
  auto part = in_trial.begin();
  const bool in_an_output = !in_trial.empty() && ++part != in_trial.end() && *part == kOutputDir &&
                            ++part != in_trial.end();
  if (in_an_output || !PathInside(checkpoint, cache_->dir() + "/trees").empty()) {
    return Status::Ok();
  }
  return InvalidArgumentError("checkpoint " + checkpoint +
                              " lies outside the trial's runs on this node (a checkpoint is "
                              "inside a run's output/, or a copy in the input cache)");
}

StatusOr<std::map<std::string, std::string>> RunManager::InputPaths(
    const RunRequest& request) const {
  std::map<std::string, std::string> input_paths = request.local_paths;
  for (const auto& [key, tree] : request.inputs) {
    if (input_paths.count(key) > 0) {
      return InvalidArgumentError("inputs[" + key + "]: the key already has a path on this node");
    }
    auto path = cache_->Materialize(tree);
    if (!path.ok()) return path.status().WithContext("inputs[" + key + "]");
    input_paths[key] = *path;
  }
  return input_paths;
}

StatusOr<std::string> RunManager::ResumeCheckpoint(const RunRequest& request) const {
  if (request.resume_tree) {
    // Trees are content-addressed and never written to (llm-train only reads a checkpoint it
    // resumes from), so the cache's copy is resumed from in place.
    auto path = cache_->Materialize(*request.resume_tree);
    if (!path.ok()) return path.status().WithContext("resume_from.tree");
    if (!FileExists(*path + "/" + kCheckpointStateFile)) {
      return InvalidArgumentError("resume_from.tree " + request.resume_tree->digest +
                                  " is no checkpoint: it has no " + kCheckpointStateFile);
    }
    return *path;
  }
  if (request.resume_checkpoint.empty()) return std::string();
  const std::string from = "resume from " + DescribeRunKey(request.resume_run);
  {
    MutexLock lock(mutex_);
    if (runs_.count(request.resume_run) == 0) {
      return FailedPreconditionError(from + ": this node has no such run");
    }
  }
  RETURN_IF_ERROR(CheckResumeCheckpoint(request.key, request.resume_run, request.resume_checkpoint)
                      .WithContext(from));
  // What SaveCheckpoint writes last into a complete checkpoint (trainer/train/checkpoints.h).
  if (!FileExists(request.resume_checkpoint + "/" + kCheckpointStateFile)) {
    return FailedPreconditionError(from + ": its checkpoint " + request.resume_checkpoint +
                                   " is gone from this node");
  }
  return request.resume_checkpoint;
}

StatusOr<RunState> RunManager::StartRun(const RunRequest& request) {
  RETURN_IF_ERROR(CheckKey(request.key));
  if (StatusOr<RunState> existing = Get(request.key); existing.ok()) return existing;
  RETURN_IF_ERROR(CheckPlacement(request));
  ASSIGN_OR_RETURN(const auto input_paths, InputPaths(request));
  WorkerLaunch launch;
  ASSIGN_OR_RETURN(launch.resume_checkpoint, ResumeCheckpoint(request));
  launch.run_dir = RunDirFor(request.key);
  ASSIGN_OR_RETURN(launch.trial_file, MakeTrialFile(request.config_json, input_paths,
                                                    launch.run_dir + "/" + kOutputDir));
  RETURN_IF_ERROR(CheckTrialPlacement(request, launch.trial_file));
  launch.llm_train = options_.llm_train;
  launch.group = request.node_group;
  if (launch.group.nodes <= 1) launch.group = NodeGroup{};
  launch.device_indices = request.device_indices;
  launch.cache_dir = cache_->dir();
  // Before the lock: finding the interface that reaches node rank 0 resolves master_addr, which
  // may take a DNS timeout, while every other call, the watcher and the sampler wait on the lock.
  const std::vector<std::string> environment =
      WorkerEnvironment(launch, DescribeRunKey(request.key));

  MutexLock lock(mutex_);
  // Checked again: another call with this key may have started it meanwhile.
  if (auto it = runs_.find(request.key); it != runs_.end()) return StateOf(it->first, it->second);
  RETURN_IF_ERROR(CreateRunDir(launch));
  auto [it, inserted] = runs_.emplace(request.key, LaunchSupervisor(launch, environment));
  WakeWatcher();  // to watch the new supervisor's exit
  return StateOf(it->first, it->second);
}

RunManager::Run RunManager::LaunchSupervisor(const WorkerLaunch& launch,
                                             const std::vector<std::string>& environment) {
  SupervisorCommand command;
  command.run_dir = launch.run_dir;
  command.grace = options_.cancel_grace;
  command.worker_argv = WorkerArgv(launch);
  const std::optional<uint64_t> oom_kills_at_start = ReadOomKillCount();
  const StatusOr<pid_t> pid = SpawnSupervisor(SupervisorArgv(options_.supervisor_program, command),
                                              environment, launch.run_dir + "/" + kSupervisorLog);
  Run run;
  run.dir = launch.run_dir;
  run.device_type = launch.trial_file.device;
  run.device_indices = launch.device_indices;
  run.ranks = launch.trial_file.ranks;
  run.node_rank = launch.group.node_rank;
  run.nodes = launch.group.nodes;
  if (!pid.ok()) {
    RunEnd end;
    end.outcome = trial_outcome::kFailed;
    end.error = pid.status().message();
    EndRun(run, end);
    return run;
  }
  run.supervisor_pid = *pid;
  run.oom_kills_at_start = oom_kills_at_start;
  run.is_child = true;
  // Read at once: the process exists from the moment posix_spawn returns, exec'd or not.
  run.supervisor_start_time = ProcessStartTime(*pid).value_or(0);
  run.supervisor_exit = OpenExitWatch(*pid, run.supervisor_start_time);
  nlohmann::json supervisor = {{"pid", *pid}, {"start_time", run.supervisor_start_time}};
  if (oom_kills_at_start) supervisor["oom_kills"] = *oom_kills_at_start;
  const Status recorded = WriteJsonFile(run.dir + "/" + kSupervisorFile, supervisor);
  (void)recorded;  // without it a restarted agent reports the run as vanished
  return run;
}

StatusOr<RunState> RunManager::Get(const RunKey& key) {
  MutexLock lock(mutex_);
  auto it = runs_.find(key);
  if (it == runs_.end()) return NotFoundError("no run for " + DescribeRunKey(key));
  return StateOf(it->first, it->second);
}

StatusOr<std::optional<RunEnd>> RunManager::Ended(const RunKey& key,
                                                  std::chrono::milliseconds wait) {
  MutexLock lock(mutex_);
  auto it = runs_.find(key);
  if (it == runs_.end()) return NotFoundError("no run for " + DescribeRunKey(key));
  const auto deadline = std::chrono::steady_clock::now() + wait;
  while (!it->second.end.has_value() && !stopping_ && ended_.WaitUntil(mutex_, deadline)) {
  }
  return it->second.end;
}

std::vector<RunState> RunManager::List() {
  MutexLock lock(mutex_);
  std::vector<RunState> states;
  for (auto& [key, run] : runs_) states.push_back(StateOf(key, run));
  return states;
}

std::vector<RunningRun> RunManager::Running() {
  MutexLock lock(mutex_);
  std::vector<RunningRun> running;
  for (const auto& [key, run] : runs_) {
    if (run.end || run.device_type.empty()) continue;
    running.push_back(RunningRun{key, run.dir, run.device_type, run.device_indices});
  }
  return running;
}

StatusOr<RunRanks> RunManager::Ranks(const RunKey& key) const {
  MutexLock lock(mutex_);
  auto it = runs_.find(key);
  if (it == runs_.end()) return NotFoundError("no run for " + DescribeRunKey(key));
  const Run& run = it->second;
  return RunRanks{run.node_rank * run.ranks, run.ranks};
}

StatusOr<std::string> RunManager::RunDir(const RunKey& key) const {
  MutexLock lock(mutex_);
  auto it = runs_.find(key);
  if (it == runs_.end()) return NotFoundError("no run for " + DescribeRunKey(key));
  return it->second.dir;
}

StatusOr<RunState> RunManager::WaitForEnd(const RunKey& key, std::chrono::milliseconds timeout) {
  MutexLock lock(mutex_);
  auto it = runs_.find(key);
  if (it == runs_.end()) return NotFoundError("no run for " + DescribeRunKey(key));
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!it->second.end.has_value() && !stopping_ && ended_.WaitUntil(mutex_, deadline)) {
  }
  return StateOf(it->first, it->second);
}

Status RunManager::RequestCancel(Run& run,
                                 std::optional<std::chrono::milliseconds> checkpoint_grace) {
  // The marker first: whoever decides the outcome, now or after a restart, sees the request.
  RETURN_IF_ERROR(
      WriteFileAtomically(run.dir + "/" + kCancelFile, [](int) { return Status::Ok(); }));
  if (run.supervisor_pid <= 0 ||
      !IsSameProcessAlive(run.supervisor_pid, run.supervisor_start_time)) {
    return Status::Ok();
  }
  if (!checkpoint_grace) {
    ::kill(run.supervisor_pid, SIGTERM);
    return Status::Ok();
  }
  sigval grace;
  grace.sival_int = static_cast<int>(checkpoint_grace->count());
  if (::sigqueue(run.supervisor_pid, SIGUSR1, grace) != 0) {
    return UnavailableError("cannot signal the supervisor of " + run.dir + ": " +
                            std::strerror(errno));
  }
  return Status::Ok();
}

StatusOr<RunState> RunManager::Cancel(const RunKey& key) {
  {
    MutexLock lock(mutex_);
    auto it = runs_.find(key);
    if (it == runs_.end()) return NotFoundError("no run for " + DescribeRunKey(key));
    Run& run = it->second;
    if (run.end) return StateOf(it->first, run);
    RETURN_IF_ERROR(RequestCancel(run, std::nullopt));
  }
  return WaitForEnd(key, options_.cancel_grace + std::chrono::seconds(5));
}

StatusOr<RunState> RunManager::CancelWithCheckpoint(const RunKey& key,
                                                    std::chrono::milliseconds grace) {
  if (grace.count() < 0 || grace > kMaxCheckpointGrace) {
    return InvalidArgumentError("checkpoint grace: must be 0 to " +
                                std::to_string(kMaxCheckpointGrace.count()) + " ms, got " +
                                std::to_string(grace.count()));
  }
  MutexLock lock(mutex_);
  auto it = runs_.find(key);
  if (it == runs_.end()) return NotFoundError("no run for " + DescribeRunKey(key));
  Run& run = it->second;
  if (!run.end) RETURN_IF_ERROR(RequestCancel(run, grace));
  return StateOf(it->first, run);
}

}  // namespace llmctl::agent
