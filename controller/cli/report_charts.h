// The charts of `llmctl report --format html`: inline SVG (no script, nothing loaded), one style,
// pure functions of the ReportResponse (golden-file tested through report_test).
#ifndef LLMCTL_CONTROLLER_CLI_REPORT_CHARTS_H_
#define LLMCTL_CONTROLLER_CLI_REPORT_CHARTS_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "llmctl/v1/controller.pb.h"

namespace llmctl::cli {

// Per trial, its snapshot at peak of each phase as stacked bars (params, grads, device optimizer
// state, acts), every trial on one scale; with the colours' legend.
std::string PhaseCharts(const v1::ReportResponse& report);

// One horizontal bar per trial: train seconds, tokens per second.
std::string TrainTimeChart(const v1::ReportResponse& report);
std::string TokensPerSecondChart(const v1::ReportResponse& report);

// Expected and observed outcome of each trial, as pills.
std::string OutcomeChart(const v1::ReportResponse& report);

// One trial's memory over time on one axis of seconds. Each attempt of the run counts from its
// trainer's start (elapsed_ms), and the attempts of a resumed run follow each other without the
// time between them; a GPU's device samples are placed by their node's wall clock against rank 0's
// trainer's start, read on the same clock (started_unix_ms for node rank 0, node_started_unix_ms
// for the others, which the store sets where the ranks met), so two nodes' clocks are never mixed
// and a node launched later is not drawn early: samples from before that start are left out; a
// node without one (an attempt's events from an llm-train older than ranks_met_elapsed_ms) is not
// drawn but listed with the most memory it had in use; a CPU node's samples, the trial's resident
// memory, are no device's memory and left out too.
struct MemoryTimeline {
  struct Attempt {
    int32_t attempt = 0;
    double start_seconds = 0;  // where its trainer's start lies on the axis
    double end_seconds = 0;    // its trainer's end, or its last snapshot or sample if later
    int64_t limit_bytes = 0;   // its device limit; 0: none
  };
  struct Snapshot {
    int32_t attempt = 0;
    double seconds = 0;
    int64_t allocated_bytes = 0;
    int64_t reserved_bytes = 0;
    std::string phase;  // as the trainer named it; "oom" where an allocation failed
    int64_t step = 0;
    int32_t micro_batch = 0;
  };
  struct Sample {
    double seconds = 0;
    int64_t used_bytes = 0;
  };
  std::vector<Attempt> attempts;    // the run's, in order
  std::vector<Snapshot> snapshots;  // the run's, in order
  // By device: "cuda:0", or "node 1 cuda:0" over several nodes (DeviceName).
  std::map<std::string, std::vector<Sample>> device_used;
  // The devices of a multi-node attempt's other nodes whose samples cannot be placed, as the
  // attempt's events do not say when rank 0 started on that node's clock (no node_started_unix_ms):
  // by device (DeviceName), the most memory any of its samples had in use, which needs no time.
  std::map<std::string, int64_t> unplaced_used;
  double end_seconds = 0;
  int64_t top_bytes = 0;  // the most that any series or limit reaches
};
MemoryTimeline LayOutMemoryTimeline(const v1::TrialReport& trial);

// Small multiples of LayOutMemoryTimeline, one figure per trial, with their legend: allocated and
// reserved bytes at each snapshot, the phase each snapshot closes, the GPU's memory in use,
// each attempt's device limit, where the run ran out of memory and where a resumed run's next
// attempt began.
std::string MemoryTimelineCharts(const v1::ReportResponse& report);

}  // namespace llmctl::cli

#endif  // LLMCTL_CONTROLLER_CLI_REPORT_CHARTS_H_
