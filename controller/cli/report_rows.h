// What the formats of `llmctl report` derive from a trial (internal to controller/cli's report):
// the lab table's columns and cells (the table, Markdown and HTML), the predictions' errors, and a
// multi-rank trial's highest peak and per-phase ranges over its ranks.
#ifndef LLMCTL_CONTROLLER_CLI_REPORT_ROWS_H_
#define LLMCTL_CONTROLLER_CLI_REPORT_ROWS_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "llmctl/v1/controller.pb.h"

namespace llmctl::cli {

// The cells of one row of the lab table, in LabColumns order; the outcome cell without emphasis.
struct LabRow {
  std::vector<std::string> cells;
  bool unexpected = false;
};

inline constexpr size_t kOutcomeColumn = 2;
inline constexpr size_t kFirstNumericColumn = 3;

// The lab table's optional columns.
struct LabLayout {
  // Some trial's snapshot at peak holds data parallelism's buffers or gathered parameters: a
  // column for them, so that the memory columns add up to the allocated bytes.
  bool comm = false;
  // Some trial was submitted with the estimate's prediction: predicted peak and its error.
  bool predicted = false;
  // Some trial's prediction has a time: predicted tokens/s and its error.
  bool timed = false;
  // Some trial has a MachinePace: the pace and the error at it.
  bool paced = false;
};

LabLayout LabLayoutOf(const v1::ReportResponse& report);

std::vector<std::string> LabColumns(const LabLayout& layout);

// One trial's row of the lab table, "–" in the cells it does not have.
LabRow MakeLabRow(const v1::TrialReport& trial, const LabLayout& layout);

inline constexpr std::string_view kPredictionNote =
    "predicted MiB: the peak `llmctl estimate` predicted at submit, at the longest micro-batch the "
    "run draws when its data was on the submitting machine, else at max_seq_length tokens, (OOM) "
    "past its device's limit and (tight) within the allocator's slack of it; error: (predicted - "
    "measured) / measured, for trials that ended ok";

inline constexpr std::string_view kTimeNote =
    "tokens/s: the run's steps after each attempt's first (which also creates the optimizer's "
    "state and warms the kernels up), anything else on the machine included; the whole run's for "
    "a one-step run; predicted tokens/s: what `llmctl estimate` predicted at submit, in real "
    "tokens at the mean micro-batch the run draws (else full sequences); error: (predicted - "
    "measured) / measured, for trials that ended ok";

// The steps ± column's meaning, under every lab table.
inline constexpr std::string_view kStepVariationNote =
    "steps \u00b1: how much the time a token of the steps after each attempt's first moved around "
    "its mean (their standard deviation over it; \u2013 with fewer than two): a tokens/s "
    "prediction's error within it is the run's noise as much as the prediction's";

// The pace columns' meaning, under a lab table that has them.
inline constexpr std::string_view kPaceNote =
    "pace: how fast the machine ran while the trial's tokens/s was measured against the pace its "
    "prediction assumed (its probe's, or the machine's usual pace where the store's runs measured "
    "one), by one fixed product of fp32 matrices the trainer times after each step and the probe "
    "among its rates (1.20: 1.2x as fast); error at pace: the predicted tokens/s times the pace "
    "against the measured, what is left of the error once the machine's moment is taken out";

// Where the predicted tokens/s came from, one line per distinct source among the trials with a
// predicted time, in the trials' order: the calibration and the rates (a probe's, with how much
// its machine's speed moved while measured, or the data sheet's) that `llmctl submit` predicted
// them at. "predicted tokens/s at: SOURCE" when every such trial shares one; else each line names
// its trials, "predicted tokens/s of a, b at: SOURCE".
std::vector<std::string> TimeSourceLines(const v1::ReportResponse& report);

// The run's tokens per second in its steady state: its steps' tokens over their seconds, leaving
// out each attempt's first step, whose one-time work (the optimizer's state created, the kernels
// and the allocator warmed up) a prediction of the step leaves out too: on the CPU lab's 6-step
// rows it is 4-10% of the train time, and any step without a time (a hostile line's negative or
// infinite seconds). The whole run's figure (tokens_per_second) when no step is left (a one-step
// run, or a report without its steps) or their seconds sum past every double.
double SteadyTokensPerSecond(const v1::TrialReport& trial);

// How much the steps SteadyTokensPerSecond is taken over moved: the sample standard deviation of
// their seconds a token over its mean (a coefficient of variation; 0.09: a step took 9% more or
// less than the mean, typically). A tokens/s measured over a few steps is no steadier than they
// were: the CPU lab's 5-step rows on a 2-core Xeon moved 8-21% (12-05), so an error of 15% against
// the prediction can be the run's as much as the estimate's. nullopt with fewer than two such steps
// with tokens, where that tokens/s is no measurement (MeasuredRate), or where it is not finite (a
// hostile line's step of 1e300 s a token).
std::optional<double> StepVariation(const v1::TrialReport& trial);

// The share of the trainer's CPUs' time (0 to 1) other processes took during the steps
// SteadyTokensPerSecond is taken over, weighted by their seconds: llm-train measures it in a
// one-process trial's steps. nullopt where no such step has it (several ranks, an older trainer)
// and where that tokens/s is no measurement (MeasuredRate).
std::optional<double> OthersCpuShare(const v1::TrialReport& trial);

// "busy machine: ... bf16-true 48%, sgd 12%; ...": the trials whose tokens/s were measured while
// others took at least kBusyMachineShare (common/machine_cpu.h), with their shares; "" when none
// was.
std::string BusyMachineLine(const v1::ReportResponse& report);

// `rate` (SteadyTokensPerSecond or the whole run's tokens/s) when it is a measurement: nullopt
// while the trial has not ended (its steps so far are no steady figure yet) and when it measured
// none (0: an ended trial without a measured step, such as an OOM before its first step ended), or
// when it is infinite (a step of a hostile line's 1e-310 s).
// Every format's tokens/s goes through it, so the table's "–", the CSV's empty field and the
// JSON's null mark the same trials.
std::optional<double> MeasuredRate(const v1::TrialReport& trial, double rate);

// The predicted tokens/s' error against SteadyTokensPerSecond, as PredictionError; nullopt
// without both, or when it is not finite.
std::optional<double> TimePredictionError(const v1::TrialReport& trial);

// How fast the machine ran while the steps SteadyTokensPerSecond is taken over ran, against the
// pace the trial's predicted time assumed (its probe's, or the machine's usual pace where the
// store's runs measured one): the prediction's pace_seconds over the median of those steps'
// (trainer/train/machine_pace.h's canary; 1.2: the canary ran 1.2x as fast after the steps). On a
// shared VM a step takes 1.4-2x its time minutes apart, which no estimate made before the run can
// know: the pace says how much of a tokens/s prediction's error is the machine's moment. nullopt
// without the probe's pace (the data sheet's rates, a GPU's probe, one before version 20), without
// a step's (several ranks, a profiled run, an older trainer), for a trial that did not end ok, and
// where its tokens/s is no measurement (MeasuredRate).
std::optional<double> MachinePace(const v1::TrialReport& trial);

// The predicted tokens/s times MachinePace against SteadyTokensPerSecond, as TimePredictionError:
// what is left of its error once the machine's moment is taken out. nullopt without both.
std::optional<double> TimePredictionErrorAtPace(const v1::TrialReport& trial);

// The predicted peak's error against the measured one, (predicted - measured) / measured: for a
// trial that ran to the end (an out-of-memory trial's peak is where the allocation failed, not its
// peak); nullopt otherwise.
std::optional<double> PredictionError(const v1::TrialReport& trial);

// A multi-rank trial's highest peak over its ranks.
int64_t MaxRankPeak(const v1::TrialReport& trial);

// One phase's allocated bytes over a multi-rank trial's ranks.
struct PhaseRange {
  std::string phase;
  int64_t min = 0;
  int64_t max = 0;
};

// Per phase, in the ranks' step-anatomy order, the least and the most over the ranks of the
// phase's snapshot with the most allocated bytes.
std::vector<PhaseRange> PhaseRanges(const v1::TrialReport& trial);

// "69.6–73.9" (MiB), or one figure when both ends are the same.
std::string MibRange(int64_t min, int64_t max);

}  // namespace llmctl::cli

#endif  // LLMCTL_CONTROLLER_CLI_REPORT_ROWS_H_
