#include "agent/runs.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/eventfd.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>
#include <type_traits>

#include "agent/process.h"
#include "agent/socket_interface.h"
#include "agent/supervisor.h"
#include "agent/trial_file.h"
#include "common/atomic_file.h"
#include "common/files.h"
#include "common/rank_files.h"
#include "common/trial_outcome.h"

extern char** environ;

namespace llmctl::agent {
namespace {

namespace fs = std::filesystem;

constexpr char kTrialFile[] = "trial.yaml";
constexpr char kDevicesFile[] = "devices.json";
constexpr char kSupervisorFile[] = "supervisor.json";
constexpr char kSupervisorLog[] = "supervisor.log";
constexpr char kCancelFile[] = "cancel_requested";
constexpr char kEndedFile[] = "ended.json";
constexpr char kOutputDir[] = "output";
constexpr char kRanksFile[] = "ranks.json";
constexpr size_t kStderrTailBytes = 64 * 1024;
constexpr size_t kMaxTrialNameBytes = 200;

Status WriteJson(const std::string& path, const nlohmann::json& json) {
  const std::string text = json.dump() + "\n";
  return WriteFileAtomically(path, [&](int fd) { return WriteAll(fd, text.data(), text.size()); });
}

std::optional<nlohmann::json> ReadJson(const std::string& path) {
  auto text = ReadFileToString(path, 1 << 20);
  if (!text.ok()) return std::nullopt;
  nlohmann::json json = nlohmann::json::parse(*text, nullptr, /*allow_exceptions=*/false);
  if (json.is_discarded() || !json.is_object()) return std::nullopt;
  return json;
}

// `json[key]` when it is an integer (a string when `T` is one), else `fallback`: these files are
// read back after a crash, and ranks.json is llm-train's, so a field of the wrong type must not
// throw as nlohmann's value() does.
template <typename T>
T FieldOr(const nlohmann::json& json, const char* key, T fallback) {
  const auto field = json.find(key);
  if (field == json.end()) return fallback;
  if constexpr (std::is_same_v<T, std::string>) {
    return field->is_string() ? field->get<std::string>() : fallback;
  } else {
    return field->is_number_integer() ? field->get<T>() : fallback;
  }
}

bool Exists(const std::string& path) {
  struct stat info;
  return ::stat(path.c_str(), &info) == 0;
}

// Adds the complete lines (ending in '\n') in the file after `offset` to `lines` and moves
// `offset` past the last byte read: called again, it reads only what was appended since.
void CountNewLines(const std::string& path, int64_t& offset, int64_t& lines) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return;
  char buffer[1 << 16];
  ssize_t n;
  while ((n = ::pread(fd, buffer, sizeof(buffer), offset)) > 0) {
    lines += std::count(buffer, buffer + n, '\n');
    offset += n;
  }
  ::close(fd);
}

std::string ReadTail(const std::string& path, size_t bytes) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return "";
  struct stat info;
  std::string text;
  if (::fstat(fd, &info) == 0) {
    const off_t start = info.st_size > static_cast<off_t>(bytes) ? info.st_size - bytes : 0;
    text.resize(static_cast<size_t>(info.st_size - start));
    const ssize_t n = ::pread(fd, text.data(), text.size(), start);
    text.resize(n > 0 ? static_cast<size_t>(n) : 0);
  }
  ::close(fd);
  return text;
}

nlohmann::json EndToJson(const RunEnd& end) {
  return {{"outcome", end.outcome}, {"exit_code", end.exit_code}, {"error", end.error}};
}

std::optional<RunEnd> EndFromJson(const nlohmann::json& json) {
  if (!json.contains("outcome") || !json["outcome"].is_string()) return std::nullopt;
  RunEnd end;
  end.outcome = json["outcome"].get<std::string>();
  end.exit_code = FieldOr(json, "exit_code", 0);
  end.error = FieldOr(json, "error", std::string());
  return end;
}

Status CheckKey(const RunKey& key) {
  if (key.experiment_id <= 0) {
    return InvalidArgumentError("run key: experiment_id must be positive, got " +
                                std::to_string(key.experiment_id));
  }
  if (key.attempt <= 0) {
    return InvalidArgumentError("run key: attempt must be positive, got " +
                                std::to_string(key.attempt));
  }
  if (key.trial.empty() || key.trial == "." || key.trial == ".." ||
      key.trial.size() > kMaxTrialNameBytes) {
    return InvalidArgumentError("run key: trial name '" + key.trial +
                                "' must be 1 to 200 bytes and not '.' or '..'");
  }
  return Status::Ok();
}

// Whole-number directory names only ("3", not "03" or "x").
std::optional<int64_t> ParsePositive(const std::string& text) {
  if (text.empty() || text.size() > 18 || text[0] == '0' ||
      !std::all_of(text.begin(), text.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    return std::nullopt;
  }
  return std::stoll(text);
}

// The first failed rank as llm-train's launcher recorded it in ranks.json; nullopt when none did.
std::optional<RankExit> ReadFirstFailedRank(const std::string& path) {
  auto json = ReadJson(path);
  if (!json) return std::nullopt;
  const nlohmann::json failure = json->value("first_failure", nlohmann::json());
  if (!failure.is_object() || !failure.value("rank", nlohmann::json()).is_number_integer()) {
    return std::nullopt;
  }
  RankExit exit;
  exit.rank = failure["rank"].get<int>();
  if (exit.rank < 0) return std::nullopt;
  exit.exit.signal = FieldOr(failure, "signal", 0);
  exit.exit.exit_code = FieldOr(failure, "exit_code", 0);
  return exit;
}

// The rendezvous port llm-train's launcher recorded in ranks.json; 0 when it has not yet.
int ReadMasterPort(const std::string& path) {
  auto json = ReadJson(path);
  if (!json) return 0;
  const nlohmann::json port = json->value("master_port", nlohmann::json());
  if (!port.is_number_integer() || port.get<int64_t>() < 1 || port.get<int64_t>() > 65535) return 0;
  return port.get<int>();
}

// The checks of a multi-node run's group that need no trial config.
Status CheckNodeGroup(const NodeGroup& group) {
  if (group.node_rank < 0 || group.node_rank >= group.nodes) {
    return InvalidArgumentError("node_group.node_rank: " + std::to_string(group.node_rank) +
                                " is not a node rank of " + std::to_string(group.nodes) +
                                " nodes (0.." + std::to_string(group.nodes - 1) + ")");
  }
  if (group.node_rank == 0) {
    if (group.master_port != 0) {
      return InvalidArgumentError(
          "node_group.master_port: node rank 0 binds a free port for the rendezvous, so it must "
          "be 0, got " +
          std::to_string(group.master_port));
    }
    return Status::Ok();
  }
  if (group.master_addr.empty()) {
    return InvalidArgumentError("node_group.master_addr: node rank " +
                                std::to_string(group.node_rank) +
                                " needs node rank 0's address, got none");
  }
  if (group.master_port < 1 || group.master_port > 65535) {
    return InvalidArgumentError("node_group.master_port: node rank " +
                                std::to_string(group.node_rank) +
                                " needs node rank 0's rendezvous port (1..65535), got " +
                                std::to_string(group.master_port));
  }
  return Status::Ok();
}

}  // namespace

std::string RankEventsFile(int rank) { return RankEventsPath(kEventsFile, rank); }

std::string DescribeRunKey(const RunKey& key) {
  return "experiment " + std::to_string(key.experiment_id) + ", trial '" + key.trial +
         "', attempt " + std::to_string(key.attempt);
}

std::string EncodeTrialName(const std::string& trial) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string encoded;
  for (unsigned char c : trial) {
    if (std::isalnum(c) || c == '.' || c == '_' || c == '-') {
      encoded += static_cast<char>(c);
    } else {
      encoded += '%';
      encoded += kHex[c >> 4];
      encoded += kHex[c & 15];
    }
  }
  return encoded;
}

std::optional<std::string> DecodeTrialName(const std::string& encoded) {
  std::string trial;
  for (size_t i = 0; i < encoded.size(); ++i) {
    if (encoded[i] != '%') {
      trial += encoded[i];
      continue;
    }
    if (i + 2 >= encoded.size()) return std::nullopt;
    const std::string hex = encoded.substr(i + 1, 2);
    if (!std::isxdigit(static_cast<unsigned char>(hex[0])) ||
        !std::isxdigit(static_cast<unsigned char>(hex[1]))) {
      return std::nullopt;
    }
    trial += static_cast<char>(std::stoi(hex, nullptr, 16));
    i += 2;
  }
  return trial;
}

RunManager::RunManager(RunManagerOptions options, InputCache* cache)
    : options_(std::move(options)), cache_(cache) {}

StatusOr<std::unique_ptr<RunManager>> RunManager::Open(RunManagerOptions options,
                                                       InputCache* cache) {
  std::error_code error;
  fs::create_directories(options.data_dir + "/runs", error);
  if (error) {
    return UnavailableError("cannot create " + options.data_dir + "/runs: " + error.message());
  }
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

Status RunManager::Recover() {
  std::error_code error;
  const fs::path runs_dir = options_.data_dir + "/runs";
  MutexLock lock(mutex_);
  for (const auto& experiment : fs::directory_iterator(runs_dir, error)) {
    const auto experiment_id = ParsePositive(experiment.path().filename().string());
    if (!experiment_id || !experiment.is_directory()) continue;
    for (const auto& trial : fs::directory_iterator(experiment.path(), error)) {
      const auto trial_name = DecodeTrialName(trial.path().filename().string());
      if (!trial_name || !trial.is_directory()) continue;
      for (const auto& attempt : fs::directory_iterator(trial.path(), error)) {
        const auto attempt_number = ParsePositive(attempt.path().filename().string());
        if (!attempt_number || *attempt_number > INT32_MAX || !attempt.is_directory()) continue;
        const RunKey key{*experiment_id, *trial_name, static_cast<int32_t>(*attempt_number)};
        Run run;
        run.dir = attempt.path().string();
        if (auto devices = ReadJson(run.dir + "/" + kDevicesFile)) {
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
        if (auto ended = ReadJson(run.dir + "/" + kEndedFile)) run.end = EndFromJson(*ended);
        if (!run.end) {
          if (auto supervisor = ReadJson(run.dir + "/" + kSupervisorFile)) {
            run.supervisor_pid = FieldOr(*supervisor, "pid", 0);
            run.supervisor_start_time = FieldOr(*supervisor, "start_time", uint64_t{0});
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
  if (error) return UnavailableError("cannot scan " + runs_dir.string() + ": " + error.message());
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
        if (!run.end && run.supervisor_exit.valid()) {
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

void RunManager::CheckRun(Run& run) {
  if (run.is_child && run.supervisor_pid > 0) {
    int status = 0;
    if (::waitpid(run.supervisor_pid, &status, WNOHANG) == run.supervisor_pid) run.is_child = false;
  }
  // Alive first: the supervisor writes exit.json before it exits, so a dead supervisor without
  // exit.json afterwards never wrote one.
  const bool alive =
      run.supervisor_pid > 0 && IsSameProcessAlive(run.supervisor_pid, run.supervisor_start_time);
  auto exit = ReadWorkerExit(run.dir);
  const bool cancel_requested = Exists(run.dir + "/" + kCancelFile);
  if (exit.ok() && exit->has_value()) {
    const std::string stderr_tail = ReadTail(run.dir + "/" + kStderrFile, kStderrTailBytes);
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
                                    stderr_tail));
      return;
    }
    // The node's first rank's result (rank 0's, events.jsonl, unless this is node rank K > 0).
    const ResultEvent result = ReadResultEvent(run.dir + "/" + RankEventsFile(first_rank));
    EndRun(run, DecideOutcome(**exit, result, cancel_requested, stderr_tail));
    return;
  }
  if (alive) return;
  // The supervisor is gone without a word. Its worker may still run (the supervisor was killed):
  // stop it, nobody would ever collect its result.
  if (auto worker = ReadJson(run.dir + "/" + kWorkerFile)) {
    const pid_t pid = FieldOr(*worker, "pid", 0);
    if (pid > 0 && IsSameProcessAlive(pid, FieldOr(*worker, "start_time", uint64_t{0}))) {
      // -0 and -1 would name the agent's own group and every process: only a real group.
      const pid_t pgid = FieldOr(*worker, "pgid", pid);
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
  const Status written = WriteJson(run.dir + "/" + kEndedFile, EndToJson(end));
  // Without ended.json the next start decides again from the same files, with the same result.
  (void)written;
  run.end = end;
  run.supervisor_exit.reset();
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
  const auto deadline = std::chrono::steady_clock::now() + kMasterPortWait;
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

StatusOr<RunState> RunManager::StartRun(const RunRequest& request) {
  RETURN_IF_ERROR(CheckKey(request.key));
  {
    MutexLock lock(mutex_);
    if (auto it = runs_.find(request.key); it != runs_.end()) return StateOf(it->first, it->second);
  }
  for (int index : request.device_indices) {
    if (index < 0) {
      return InvalidArgumentError("device_indices: " + std::to_string(index) + " is negative");
    }
  }
  const NodeGroup& group = request.node_group;
  const bool multi_node = group.nodes > 1;
  if (multi_node) RETURN_IF_ERROR(CheckNodeGroup(group));
  std::map<std::string, std::string> input_paths = request.local_paths;
  for (const auto& [key, tree] : request.inputs) {
    if (input_paths.count(key) > 0) {
      return InvalidArgumentError("inputs[" + key + "]: the key already has a path on this node");
    }
    auto path = cache_->Materialize(tree);
    if (!path.ok()) return path.status().WithContext("inputs[" + key + "]");
    input_paths[key] = *path;
  }
  std::string resume_checkpoint = request.resume_checkpoint;
  if (request.resume_tree) {
    // Trees are content-addressed and never written to (llm-train only reads a checkpoint it
    // resumes from), so the cache's copy is resumed from in place.
    auto path = cache_->Materialize(*request.resume_tree);
    if (!path.ok()) return path.status().WithContext("resume_from.tree");
    resume_checkpoint = *path;
    if (!Exists(resume_checkpoint + "/" + kCheckpointStateFile)) {
      return InvalidArgumentError("resume_from.tree " + request.resume_tree->digest +
                                  " is no checkpoint: it has no " + kCheckpointStateFile);
    }
  } else if (!resume_checkpoint.empty()) {
    const std::string from = "resume from " + DescribeRunKey(request.resume_run);
    {
      MutexLock lock(mutex_);
      if (runs_.count(request.resume_run) == 0) {
        return FailedPreconditionError(from + ": this node has no such run");
      }
    }
    RETURN_IF_ERROR(CheckResumeCheckpoint(request.key, request.resume_run, resume_checkpoint)
                        .WithContext(from));
    // What SaveCheckpoint writes last into a complete checkpoint (trainer/train/checkpoints.h).
    if (!Exists(request.resume_checkpoint + "/" + kCheckpointStateFile)) {
      return FailedPreconditionError(from + ": its checkpoint " + request.resume_checkpoint +
                                     " is gone from this node");
    }
  }
  const std::string dir = RunDirFor(request.key);
  ASSIGN_OR_RETURN(const TrialFile trial_file,
                   MakeTrialFile(request.config_json, input_paths, dir + "/" + kOutputDir));
  if (trial_file.device == "cuda" && request.device_indices.empty()) {
    return InvalidArgumentError("a cuda trial needs device_indices");
  }
  if (multi_node && group.nodes != trial_file.nodes) {
    return InvalidArgumentError("node_group.nodes: " + std::to_string(group.nodes) +
                                " is not the trial's nodes (" + std::to_string(trial_file.nodes) +
                                ")");
  }
  if (multi_node && group.nodes > kMaxRanks / trial_file.ranks) {
    return InvalidArgumentError("node_group.nodes: " + std::to_string(group.nodes) + " x " +
                                std::to_string(trial_file.ranks) + " ranks is more than " +
                                std::to_string(kMaxRanks));
  }
  const int node_rank = multi_node ? group.node_rank : 0;
  const int nodes = multi_node ? group.nodes : 1;

  MutexLock lock(mutex_);
  // Checked again: another call with this key may have started it meanwhile.
  if (auto it = runs_.find(request.key); it != runs_.end()) return StateOf(it->first, it->second);
  // The directory is assembled under a temporary name and renamed, so a half-made run is never
  // found by a restarted agent.
  const std::string staging = dir + ".new";
  std::error_code error;
  fs::remove_all(staging, error);
  fs::create_directories(staging + "/" + kOutputDir, error);
  if (error) return UnavailableError("cannot create " + staging + ": " + error.message());
  RETURN_IF_ERROR(WriteFileAtomically(staging + "/" + kTrialFile, [&](int fd) {
    return WriteAll(fd, trial_file.yaml.data(), trial_file.yaml.size());
  }));
  RETURN_IF_ERROR(WriteJson(staging + "/" + kDevicesFile, {{"type", trial_file.device},
                                                           {"indices", request.device_indices},
                                                           {"ranks", trial_file.ranks},
                                                           {"nodes", nodes},
                                                           {"node_rank", node_rank}}));
  if (::rename(staging.c_str(), dir.c_str()) != 0) {
    return UnavailableError("cannot create run directory " + dir + ": " + std::strerror(errno));
  }

  SupervisorCommand command;
  command.run_dir = dir;
  command.grace = options_.cancel_grace;
  command.worker_argv = {options_.llm_train, "--config", dir + "/" + kTrialFile, "--events",
                         dir + "/" + kEventsFile};
  for (const auto& [path, written] : trial_file.input_names) {
    command.worker_argv.insert(command.worker_argv.end(), {"--input-name", path + "=" + written});
  }
  if (!resume_checkpoint.empty()) {
    command.worker_argv.insert(command.worker_argv.end(), {"--resume", resume_checkpoint});
  }
  if (multi_node) {
    // This node's ranks are global ranks node_rank x ranks on. Node rank 0's launcher binds a free
    // port as below (RunState.master_port reports it) and its rank 0 listens on all of the host's
    // addresses, its local peers coming over loopback; the others meet it at its address and port.
    const bool first_node = node_rank == 0;
    command.worker_argv.insert(command.worker_argv.end(),
                               {"--nproc", std::to_string(trial_file.ranks), "--nnodes",
                                std::to_string(nodes), "--node-rank", std::to_string(node_rank),
                                "--master-addr", first_node ? "127.0.0.1" : group.master_addr,
                                "--master-port", std::to_string(first_node ? 0 : group.master_port),
                                "--ranks-file", dir + "/" + kRanksFile});
  } else if (trial_file.ranks > 1) {
    // llm-train's launcher starts the ranks under this one worker (its process group, so the
    // supervisor's signals and its final SIGKILL reach them all); port 0: it takes a free port
    // from the kernel and hands rank 0 the listening socket, so trials on one node never collide.
    command.worker_argv.insert(command.worker_argv.end(),
                               {"--nproc", std::to_string(trial_file.ranks), "--master-port", "0",
                                "--ranks-file", dir + "/" + kRanksFile});
  }
  const std::vector<std::string> argv = SupervisorArgv(options_.supervisor_program, command);
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string_view entry(*e);
    if (entry.starts_with("CUDA_VISIBLE_DEVICES=") || entry.starts_with("LLMCTL_CACHE_DIR="))
      continue;
    env.emplace_back(entry);
  }
  // llm-train's token cache lives in the agent's cache, next to the inputs it was made from.
  env.push_back("LLMCTL_CACHE_DIR=" + cache_->dir());
  // A multi-node trial's ranks talk over the interface that reaches node rank 0
  // (socket_interface.h), unless the agent's own environment names one.
  if (multi_node && !group.master_addr.empty()) {
    for (const char* variable : {"GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"}) {
      if (std::getenv(variable) != nullptr) continue;
      StatusOr<std::string> interface = InterfaceReaching(group.master_addr);
      if (interface.ok()) {
        env.push_back(std::string(variable) + "=" + *interface);
      } else {
        std::cerr << "llm-agent: " << DescribeRunKey(request.key) << ": " << variable
                  << " left to the backend: " << interface.status().message() << std::endl;
      }
    }
  }
  if (trial_file.device == "cuda") {
    std::string devices;
    for (int index : request.device_indices) {
      devices += (devices.empty() ? "" : ",") + std::to_string(index);
    }
    env.push_back("CUDA_VISIBLE_DEVICES=" + devices);
  }
  std::vector<char*> argv_c;
  for (const std::string& a : argv) argv_c.push_back(const_cast<char*>(a.c_str()));
  argv_c.push_back(nullptr);
  std::vector<char*> env_c;
  for (const std::string& e : env) env_c.push_back(const_cast<char*>(e.c_str()));
  env_c.push_back(nullptr);

  posix_spawnattr_t attributes;
  posix_spawnattr_init(&attributes);
  // A new session: the supervisor leaves the agent's process group and terminal, so neither a
  // signal to the agent's group nor the agent's exit reaches it.
  posix_spawnattr_setflags(&attributes,
                           POSIX_SPAWN_SETSID | POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
  sigset_t none;
  sigemptyset(&none);
  posix_spawnattr_setsigmask(&attributes, &none);
  sigset_t defaults;
  sigemptyset(&defaults);
  for (int signal : {SIGPIPE, SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGCHLD})
    sigaddset(&defaults, signal);
  posix_spawnattr_setsigdefault(&attributes, &defaults);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  const std::string log = dir + "/" + kSupervisorLog;
  posix_spawn_file_actions_addopen(&actions, 1, log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
  posix_spawn_file_actions_adddup2(&actions, 1, 2);
  pid_t pid = 0;
  const int spawned =
      ::posix_spawn(&pid, argv_c[0], &actions, &attributes, argv_c.data(), env_c.data());
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attributes);

  Run run;
  run.dir = dir;
  run.device_type = trial_file.device;
  run.device_indices = request.device_indices;
  run.ranks = trial_file.ranks;
  run.node_rank = node_rank;
  run.nodes = nodes;
  if (spawned != 0) {
    RunEnd end;
    end.outcome = trial_outcome::kFailed;
    end.error = "cannot start the supervisor " + options_.supervisor_program + ": " +
                std::strerror(spawned);
    EndRun(run, end);
  } else {
    run.supervisor_pid = pid;
    run.is_child = true;
    // Read at once: the process exists from the moment posix_spawn returns, exec'd or not.
    run.supervisor_start_time = ProcessStartTime(pid).value_or(0);
    run.supervisor_exit = OpenExitWatch(pid, run.supervisor_start_time);
    const Status recorded = WriteJson(dir + "/" + kSupervisorFile,
                                      {{"pid", pid}, {"start_time", run.supervisor_start_time}});
    (void)recorded;  // without it a restarted agent reports the run as vanished
  }
  auto [it, inserted] = runs_.emplace(request.key, std::move(run));
  WakeWatcher();  // to watch the new supervisor's exit
  return StateOf(it->first, it->second);
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
