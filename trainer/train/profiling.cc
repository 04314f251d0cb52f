#include "trainer/train/profiling.h"

#include <ATen/record_function.h>
#include <fcntl.h>
#include <torch/csrc/autograd/profiler_kineto.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <set>
#include <system_error>
#include <utility>

#include "common/atomic_file.h"
#include "common/snapshot_event.h"
#include "common/unique_fd.h"

namespace llmctl::trainer {
namespace {

namespace kineto = torch::autograd::profiler;
using torch::profiler::impl::ActivityType;
using torch::profiler::impl::ProfilerConfig;
using torch::profiler::impl::ProfilerState;

// Input shapes are cheap and say which matmul is which; Kineto's memory events are not recorded:
// LibTorch's CPU allocator reports them with the counting allocator's headers included, and the
// memory history has the exact figures.
ProfilerConfig KinetoConfig() {
  return ProfilerConfig(ProfilerState::KINETO, /*report_input_shapes=*/true,
                        /*profile_memory=*/false, /*with_stack=*/false, /*with_flops=*/false,
                        /*with_modules=*/false);
}

std::set<ActivityType> Activities(torch::Device device) {
  std::set<ActivityType> activities{ActivityType::CPU};
  if (device.is_cuda()) activities.insert(ActivityType::CUDA);
  return activities;
}

// What runs after each phase boundary of trainer.h's step anatomy.
std::string_view NextPart(std::string_view phase, bool last_micro_batch) {
  if (phase == snapshot_event::kBeforeForward) return "forward";
  if (phase == snapshot_event::kAfterForward) return "backward";
  if (phase == snapshot_event::kAfterBackward)
    return last_micro_batch ? "optimizer step" : "next micro-batch";
  return "after step";
}

// Why Kineto could not write its temporary file `temporary`: it says no more than "Failed to write
// to log file!" on stderr, so its write is tried again, one byte where its writes stopped (and its
// open, when it could not make the file), for the system's reason: a full disk's ENOSPC, EFBIG,
// EIO.
std::string KinetosWriteError(const std::string& temporary) {
  UniqueFd fd(::open(temporary.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644));
  if (!fd.valid()) return std::strerror(errno);
  const char newline = '\n';
  if (Status written = WriteAll(fd.get(), &newline, 1); !written.ok()) return written.message();
  return "the profiler stopped writing it without a reason";  // room was made meanwhile
}

// Writes `result`'s trace to `path`. Kineto writes the file itself, into <path>.partial.tmp,
// which it renames <path>.partial once written whole; renamed again here, a reader never sees half
// of it. On a failure neither file stays: a large trace would keep the disk as full as it made it.
Status SaveTrace(kineto::ProfilerResult& result, const std::string& path) {
  const std::string partial = path + ".partial";
  const std::string kinetos_temporary = partial + ".tmp";
  result.save(partial);
  std::error_code error;
  if (!std::filesystem::exists(partial, error)) {
    // Asked before the temporary goes: removing it makes room.
    const std::string why = KinetosWriteError(kinetos_temporary);
    std::filesystem::remove(kinetos_temporary, error);
    return UnavailableError(why);
  }
  std::filesystem::rename(partial, path, error);
  if (error) {
    std::error_code ignored;
    std::filesystem::remove(partial, ignored);
    return UnavailableError(error.message());
  }
  return Status::Ok();
}

}  // namespace

StatusOr<std::unique_ptr<StepProfiler>> StepProfiler::ForTrial(const TrialSettings& settings,
                                                               torch::Device device) {
  const int64_t steps = settings.profile.steps;
  if (steps <= 0) return std::unique_ptr<StepProfiler>();
  const std::string& output_dir = settings.output.dir;
  if (output_dir.empty()) {
    return InvalidArgumentError("profile.steps: profiles need output_dir to say where they go");
  }
  std::optional<MemoryHistory> memory;
  if (settings.profile.memory_history) {
    ASSIGN_OR_RETURN(MemoryHistory history, MemoryHistory::For(device));
    memory.emplace(std::move(history));
  }
  const int64_t first = settings.profile.first_step;
  const int64_t accumulation = settings.train.global_batch_size / settings.train.micro_batch_size;
  return std::unique_ptr<StepProfiler>(new StepProfiler(
      device, first, first + steps - 1, accumulation, output_dir + "/profile", std::move(memory)));
}

StepProfiler::StepProfiler(torch::Device device, int64_t first_step, int64_t last_step,
                           int64_t accumulation, std::string dir,
                           std::optional<MemoryHistory> memory)
    : device_(device),
      first_step_(first_step),
      last_step_(last_step),
      accumulation_(accumulation),
      dir_(std::move(dir)),
      memory_(std::move(memory)) {}

StepProfiler::~StepProfiler() {
  if (!recording_) return;
  // A run that ended without Write (an exception past the trainer): stop collecting, write nothing.
  phase_span_.reset();
  step_span_.reset();
  kineto::disableProfiler();
}

std::string StepProfiler::StepsPast(int64_t total_steps) const {
  if (last_step_ < total_steps) return "";
  const std::string asked = "profile: steps " + std::to_string(first_step_) + "-" +
                            std::to_string(last_step_) + " were asked for, but the run has " +
                            std::to_string(total_steps) + " steps";
  if (first_step_ >= total_steps) return asked + ": nothing is profiled";
  return asked + ": only steps " + std::to_string(first_step_) + "-" +
         std::to_string(total_steps - 1) + " are profiled";
}

void StepProfiler::OpenSpan(std::unique_ptr<at::RecordFunction>& span, const std::string& name) {
  span = std::make_unique<at::RecordFunction>(at::RecordScope::USER_SCOPE);
  if (span->isActive()) span->before(name);
}

void StepProfiler::Label(const std::string& what, bool marker) {
  if (!memory_) return;
  // Outside the recorded steps the label says only the part of the step, so that the labels stay
  // few over a long run; it names where the allocations live at the start were made.
  memory_->Label(recording_ ? "step " + std::to_string(step_) + ", " + what : what, marker);
}

void StepProfiler::BeginStep(int64_t step) {
  step_ = step;
  // A run resumed inside the profiled steps records those left.
  if (Profiles(step) && !recording_ && recorded_from_ < 0) {
    std::error_code error;
    std::filesystem::create_directories(dir_, error);  // Write reports a failure to write there
    if (memory_) memory_->Start(kMaxMemoryHistoryEvents);
    kineto::prepareProfiler(KinetoConfig(), Activities(device_));
    kineto::enableProfiler(KinetoConfig(), Activities(device_));
    recording_ = true;
    recorded_from_ = step;
  }
  if (recording_) {
    phase_span_.reset();
    step_span_.reset();
    OpenSpan(step_span_, "ProfilerStep#" + std::to_string(step));
    OpenSpan(phase_span_, "batches");
  }
  Label("batches", false);
}

void StepProfiler::Phase(int64_t step, int64_t micro_batch, std::string_view phase) {
  const std::string where =
      accumulation_ > 1 ? "micro-batch " + std::to_string(micro_batch) + ", " : "";
  Label(where + std::string(phase), true);
  const std::string next(NextPart(phase, micro_batch + 1 == accumulation_));
  if (recording_ && step == step_) {
    phase_span_.reset();
    OpenSpan(phase_span_, next);
  }
  Label(where + next, false);
}

ProfileFiles StepProfiler::Write(const std::vector<StorageCategory>& categories) {
  ProfileFiles files;
  if (!recording_) return files;
  recording_ = false;
  phase_span_.reset();
  step_span_.reset();
  const std::string steps = "steps-" + std::to_string(recorded_from_) + "-" + std::to_string(step_);

  std::unique_ptr<kineto::ProfilerResult> result = kineto::disableProfiler();
  const std::string trace_path = dir_ + "/trace-" + steps + ".json";
  if (Status saved = SaveTrace(*result, trace_path); saved.ok()) {
    files.paths.push_back(trace_path);
  } else {
    files.problems.push_back("cannot write the profiler's trace " + trace_path + ": " +
                             saved.message());
  }

  if (memory_) {
    const std::string memory_path = dir_ + "/memory-" + steps + ".pickle";
    auto summary = memory_->StopAndWrite(memory_path, categories);
    if (!summary.ok()) {
      files.problems.push_back(summary.status().message());
      return files;
    }
    files.paths.push_back(memory_path);
    if (summary->dropped_events > 0) {
      files.problems.push_back(
          memory_path + " holds the newest " + std::to_string(kMaxMemoryHistoryEvents) +
          " allocator events of steps " + std::to_string(recorded_from_) + "-" +
          std::to_string(step_) + "; " + std::to_string(summary->dropped_events) +
          " older ones were dropped (profile fewer steps to see them all)");
    }
  }
  return files;
}

}  // namespace llmctl::trainer
