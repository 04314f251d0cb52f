// What the report tests share: FixedReport, a report of every outcome and kind of trial the
// renderers meet, built from snapshots as the controller stores them.
#ifndef LLMCTL_CONTROLLER_CLI_REPORT_TEST_SUPPORT_H_
#define LLMCTL_CONTROLLER_CLI_REPORT_TEST_SUPPORT_H_

#include <cstdint>
#include <string>

#include "llmctl/v1/controller.pb.h"

namespace llmctl::cli::report_test_support {

inline constexpr int64_t kMiB = 1 << 20;

inline v1::MemorySnapshot Snapshot(const std::string& phase, int64_t step, int64_t params,
                                   int64_t grads, int64_t optim_device, int64_t optim_host,
                                   int64_t other) {
  v1::MemorySnapshot snap;
  snap.set_step(step);
  snap.set_phase(phase);
  snap.set_params_bytes(params);
  snap.set_grads_bytes(grads);
  snap.set_optim_device_bytes(optim_device);
  snap.set_optim_host_bytes(optim_host);
  snap.set_other_bytes(other);
  snap.set_allocated_bytes(params + grads + optim_device + other);
  snap.set_peak_bytes(snap.allocated_bytes() + 3 * kMiB);
  snap.set_reserved_bytes(snap.allocated_bytes() + 8 * kMiB);
  return snap;
}

// `attempt`'s memory over time: a snapshot at each (elapsed ms, phase, step, allocated bytes),
// reserved 8 MiB above, and device samples at (ms after the start, bytes in use).
inline v1::AttemptMemory* AddAttemptMemory(
    v1::TrialReport* trial, int32_t attempt, int64_t started_unix_ms, int64_t limit_bytes,
    const std::vector<std::tuple<double, std::string, int64_t, int64_t>>& snapshots,
    const std::vector<std::pair<int64_t, int64_t>>& samples) {
  v1::AttemptMemory* memory = trial->add_memory_timeline();
  memory->set_attempt(attempt);
  memory->set_started_unix_ms(started_unix_ms);
  memory->set_device_limit_bytes(limit_bytes);
  for (const auto& [elapsed_ms, phase, step, allocated] : snapshots) {
    v1::MemorySnapshot* snap = memory->add_snapshots();
    snap->set_elapsed_ms(elapsed_ms);
    snap->set_phase(phase);
    snap->set_step(step);
    snap->set_micro_batch(phase == "oom" ? -1 : 0);
    snap->set_allocated_bytes(allocated);
    snap->set_peak_bytes(allocated);
    snap->set_reserved_bytes(allocated + 8 * kMiB);
  }
  for (const auto& [after_ms, used] : samples) {
    v1::DeviceMemorySample* sample = memory->add_device_samples();
    sample->set_device("cuda:0");
    sample->set_unix_ms(started_unix_ms + after_ms);
    sample->set_memory_used_bytes(used);
    sample->set_memory_total_bytes(80 * 1024 * kMiB);
  }
  return memory;
}

// A fixed report covering every case a renderer meets: ok with the four phases, an expected
// out-of-memory, host-offloaded optimizer state, an outcome other than expected, a trial still
// running without snapshots, and text that needs escaping in HTML, CSV and Markdown.
inline v1::ReportResponse FixedReport() {
  v1::ReportResponse report;
  report.set_experiment_id(7);
  report.set_name("single-gpu-lab");

  v1::TrialReport* ok = report.add_trials();
  ok->set_name("reduced-batch");
  ok->set_description("lab #2: micro-batch 16 fits");
  ok->set_outcome("ok");
  ok->set_expected("ok");
  ok->set_attempt(1);
  ok->set_node("local");
  ok->set_train_seconds(137.04);
  ok->set_tokens_per_second(12506.13);
  ok->set_peak_bytes(30 * 1024 * kMiB + 419 * kMiB);
  ok->set_final_loss(1.2345);
  ok->set_load_peak_bytes(4400 * kMiB);
  ok->set_config_json(R"({"model":"tinyllama-1.1b","train":{"micro_batch_size":16}})");
  const int64_t params = 4196 * kMiB;
  ok->add_per_phase()->CopyFrom(
      Snapshot("phase0_before_fwd", 1, params, params, 2 * params, 0, 12 * kMiB));
  ok->add_per_phase()->CopyFrom(
      Snapshot("phase1_after_fwd", 1, params, params, 2 * params, 0, 9000 * kMiB));
  ok->add_per_phase()->CopyFrom(
      Snapshot("phase2_after_bwd", 1, params, params, 2 * params, 0, 900 * kMiB));
  ok->add_per_phase()->CopyFrom(
      Snapshot("phase3_after_opt_step", 0, params, params, 2 * params, 0, 40 * kMiB));
  ok->mutable_at_peak()->CopyFrom(ok->per_phase(1));
  constexpr int64_t kStart = 1'700'000'000'000;
  AddAttemptMemory(ok, 1, kStart, 80 * 1024 * kMiB,
                   {{410.5, "phase0_before_fwd", 0, 16 * 1024 * kMiB},
                    {980.25, "phase1_after_fwd", 0, 25 * 1024 * kMiB},
                    {1650, "phase2_after_bwd", 0, 17 * 1024 * kMiB},
                    {1800, "phase3_after_opt_step", 0, 16 * 1024 * kMiB},
                    {2100, "phase0_before_fwd", 1, 16 * 1024 * kMiB},
                    {2600, "phase1_after_fwd", 1, 29 * 1024 * kMiB}},
                   {{-500, 1024 * kMiB},
                    {0, 2 * 1024 * kMiB},
                    {1000, 26 * 1024 * kMiB},
                    {2000, 31 * 1024 * kMiB},
                    {3000, 31 * 1024 * kMiB}});

  v1::TrialReport* oom = report.add_trials();
  oom->set_name("baseline");
  oom->set_description("lab #1: 64/1 fp32 AdamW, \"OOM\", as expected");
  oom->set_outcome("oom");
  oom->set_expected("oom");
  oom->set_attempt(1);
  oom->set_node("local");
  oom->set_peak_bytes(93 * 1024 * kMiB);
  oom->set_error("CUDA out of memory. Tried to allocate 1.12 GiB");
  oom->add_per_phase()->CopyFrom(Snapshot("phase0_before_fwd", 0, params, 0, 0, 0, 20 * kMiB));
  oom->add_per_phase()->CopyFrom(Snapshot("oom", 0, params, 0, 0, 0, 90000 * kMiB));
  oom->mutable_at_peak()->CopyFrom(oom->per_phase(1));
  AddAttemptMemory(oom, 1, kStart, 93 * 1024 * kMiB,
                   {{300, "phase0_before_fwd", 0, 4216 * kMiB}, {950, "oom", 0, 92 * 1024 * kMiB}},
                   {});

  v1::TrialReport* offload = report.add_trials();
  offload->set_name("cpu-offload");
  offload->set_description("lab #12, max_steps 2");
  offload->set_outcome("oom");
  offload->set_expected("ok");
  offload->set_attempt(2);
  offload->set_node("gpu-1");
  offload->set_train_seconds(0.04);
  offload->set_peak_bytes(61 * kMiB);
  offload->add_per_phase()->CopyFrom(
      Snapshot("phase2_after_bwd", 0, 60 * kMiB, 0, 0, 480 * kMiB + kMiB / 10, kMiB));
  offload->mutable_at_peak()->CopyFrom(offload->per_phase(0));
  AddAttemptMemory(
      offload, 1, kStart, 0,
      {{20, "phase0_before_fwd", 0, 50 * kMiB}, {45, "phase2_after_bwd", 0, 61 * kMiB}}, {});
  offload->mutable_memory_timeline(0)->set_ended_elapsed_ms(60);  // stopped after its last snapshot
  AddAttemptMemory(
      offload, 2, kStart + 3'600'000, 0,
      {{15, "phase0_before_fwd", 1, 52 * kMiB}, {40, "phase2_after_bwd", 1, 61 * kMiB}}, {});

  v1::TrialReport* running = report.add_trials();
  running->set_name("<script>alert('x')</script>&co|pipe");
  running->set_description("runs, still");
  running->set_outcome("running");
  running->set_attempt(1);
  return report;
}

}  // namespace llmctl::cli::report_test_support

#endif  // LLMCTL_CONTROLLER_CLI_REPORT_TEST_SUPPORT_H_
