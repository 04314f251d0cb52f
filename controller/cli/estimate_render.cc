#include "controller/cli/estimate_render.h"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "common/byte_size.h"
#include "common/estimate/memory_verdict.h"
#include "common/foreign_json.h"
#include "common/printf.h"
#include "common/text.h"
#include "controller/cli/report_format.h"

namespace llmctl::cli {
namespace {

using nlohmann::ordered_json;

constexpr char kAssumptions[] =
    "Peak: one rank's highest allocated bytes in a training step, at the micro-batch lengths above "
    "(the trainer pads a micro-batch to its longest row). Not in it: on CUDA, cuBLAS' workspaces, "
    "the CUDA context and what the caching allocator holds beyond its allocated bytes (the verdict "
    "keeps room for them); on a CPU, the buffers oneDNN takes while the layers' 16-bit matmuls "
    "run, which grow with LibTorch's threads (the head's are in it where a probe of the machine "
    "measured them). docs/estimate.md has how close it came on each machine measured.";

std::string MibText(uint64_t bytes) { return Mib(static_cast<int64_t>(bytes)); }

// --explain's verdict row.
const char* VerdictExplained(estimate::MemoryVerdict verdict) {
  switch (verdict) {
    case estimate::MemoryVerdict::kFits:
      return "fits";
    case estimate::MemoryVerdict::kTight:
      return "TIGHT: past the safe bytes, within the limit; it may run out";
    case estimate::MemoryVerdict::kOom:
      return "OUT OF MEMORY: past the limit";
  }
  return "OUT OF MEMORY: past the limit";
}

// The table's verdict: "fits", "tight", "OOM", or kNone without a device.
std::string VerdictCell(std::optional<estimate::MemoryVerdict> verdict) {
  if (!verdict) return std::string(kNone);
  if (*verdict == estimate::MemoryVerdict::kOom) return "OOM";
  return std::string(estimate::VerdictName(*verdict));
}

// Minutes with a tenth, or two significant digits under one: 0.052, 0.87, 12.4.
std::string MinutesText(double seconds) {
  const double minutes = seconds / 60;
  return minutes >= 1 ? Printf("%.1f", minutes) : Printf("%.2g", minutes);
}

// Seconds with three significant digits: 0.00412, 0.317, 2.34, 118.
std::string StepSecondsText(double seconds) {
  if (seconds >= 100) return Printf("%.0f", seconds);
  if (seconds >= 1) return Printf("%.2f", seconds);
  if (seconds >= 0.1) return Printf("%.3f", seconds);
  return Printf("%.2g", seconds);
}

std::string Count(int64_t n) { return Grouped(static_cast<double>(n), 0); }

// --explain's time lines: each term of the step, the step and the start-up.
std::string ExplainTime(const TrialEstimate& e) {
  if (!e.time) return "";
  std::vector<std::vector<std::string>> time_rows;
  for (const estimate::TimeTerm& term : e.time->terms) {
    time_rows.push_back(
        {"  " + term.name,
         term.formula + (term.calibrated ? " x " + Printf("%.3f", e.time->factor) : ""),
         StepSecondsText(term.seconds) + " s"});
  }
  time_rows.push_back({"  step",
                       Grouped(static_cast<double>(e.work->tokens), 0) + " tokens a rank (" +
                           CountOf(e.work->micro_batches, "micro-batch", "micro-batches") + ")",
                       StepSecondsText(e.time->step_seconds) + " s"});
  time_rows.push_back({"  start-up",
                       "process and device, then the model's weights " +
                           std::string(e.work->pretrained ? "loaded" : "built"),
                       StepSecondsText(e.time->startup_seconds) + " s"});
  const std::string pace =
      e.time->pace != 1 ? Printf(", every term over the machine's usual pace %.2f", e.time->pace)
                        : "";
  return "time on " + e.time_device + " (" + e.calibration + "; at " + RatesText(e.rates) +
         "; x the factor" + pace + "):\n" + FormatColumns(time_rows, /*first_right_aligned=*/2);
}

// --explain's lines of one trial: the model state's formulas, then the activations' and the
// peak's (common/estimate's terms), then the verdict, then its time's (ExplainTime).
std::string Explain(const TrialEstimate& e) {
  const TrialSettings& c = e.trial->config.settings();
  const estimate::StepMemoryEstimate& m = *e.memory;
  const estimate::ModelStateEstimate& s = m.state;
  const std::string precision(Name(c.memory.precision));
  const std::string element = c.memory.precision == trial::Precision::kBf16True ? "2 B" : "4 B";
  const std::string optimizer(Name(c.train.optimizer));
  std::vector<std::vector<std::string>> rows;
  auto add = [&](const std::string& name, const std::string& formula, uint64_t bytes) {
    rows.push_back({"  " + name, formula, FormatBytes(bytes)});
  };
  const std::string per_rank =
      s.world_size > 1 ? " / " + std::to_string(s.world_size) + " ranks" : "";
  const bool sharded = c.parallel.strategy == trial::Strategy::kFsdp && s.world_size > 1;
  const bool full_offload = sharded && c.memory.offload == trial::Offload::kFull;
  add("params",
      full_offload ? "the shards are on the host (optim); the device gathers units (peak)"
                   : Count(s.parameters_total) + " values x " + element +
                         (c.peft.method == trial::PeftMethod::kQlora
                              ? " (NF4 base weights: 0.5 B + block scales)"
                              : "") +
                         (sharded ? per_rank : ""),
      s.params_bytes);
  add("grads",
      full_offload ? "on the host, with the shards (optim)"
      : s.grads_bytes == 0
          ? "none held (each is applied or moved to the host as backward makes it)"
          : Count(s.parameters_trainable) + " trainable x " + element + (sharded ? per_rank : ""),
      s.grads_bytes);
  std::string optim;
  if (full_offload) {
    optim = "on the host: the shards, their gradients and the optimizer's state (" + element +
            " per value each" + per_rank + "), " + FormatBytes(s.optim_host_bytes);
  } else if (s.optim_host_bytes > 0) {
    optim = "on the host: 16 B x " + Count(s.parameters_trainable) +
            " (fp32 weights, moments, gradient) + 4 B, " + FormatBytes(s.optim_host_bytes);
  } else if (optimizer == "adamw") {
    optim = "AdamW: 2 moments x " + Count(s.parameters_trainable) + " x " + element + " + 4 B" +
            (sharded ? per_rank : "");
  } else if (optimizer == "adamw_8bit") {
    optim = "8-bit AdamW: 2 B per value + 8 B per 256 (fp32 for tensors under 4096 values)";
  } else if (optimizer == "sgd") {
    optim = s.optim_device_bytes == 0
                ? "SGD without momentum: none"
                : "SGD momentum: " + Count(s.parameters_trainable) + " x " + element;
  }
  add("optimizer", optim, s.optim_device_bytes);
  if (s.comm_bytes > 0)
    add("comm", std::string(Name(c.parallel.strategy)) + " gradient buffers", s.comm_bytes);
  for (const estimate::EstimateTerm& term : m.terms) add(term.name, term.formula, term.bytes);
  if (e.device) {
    const double share = static_cast<double>(m.peak_bytes) / static_cast<double>(e.device->bytes);
    add("device", OnOneLine(e.device->source) + ": " + Printf("%.1f", 100.0 * share) + "% of it",
        e.device->bytes);
    const estimate::MemoryLimit& limit = e.device->limit;
    if (limit.bytes != e.device->bytes) {
      add("limit", "what the run may allocate there (less the CUDA context)", limit.bytes);
    }
    if (limit.safe_bytes != limit.bytes) {
      add("safe", "the limit less the caching allocator's slack", limit.safe_bytes);
    }
    add("verdict", VerdictExplained(*e.Verdict()), m.peak_bytes);
  }
  std::string text = OnOneLine(e.trial->name) + " (" + OnOneLine(c.model.name) + ", " + precision +
                     ", " + optimizer + "):\n";
  text += FormatColumns(rows, /*first_right_aligned=*/2);
  return text + ExplainTime(e);
}

std::vector<std::string> TableHeader(const EstimateOptions& options) {
  std::vector<std::string> header = {"trial",       "model", "ranks",  "tokens", "model state",
                                     "activations", "peak",  "device", "verdict"};
  if (options.fit) header.insert(header.end(), {"max micro-batch", "global as"});
  header.insert(header.end(), {"step s", "tok/s", "minutes"});
  return header;
}

// ranks .. verdict of an estimated trial.
std::vector<std::string> MemoryCells(const TrialEstimate& e) {
  const estimate::StepMemoryEstimate& m = *e.memory;
  return {std::to_string(m.state.world_size),
          Count(m.tokens),
          MibText(m.state.device_bytes()),
          MibText(m.activation_bytes),
          MibText(m.peak_bytes),
          e.device ? MibText(e.device->bytes) : std::string(kNone),
          VerdictCell(e.Verdict())};
}

// max micro-batch and global as (--fit).
std::vector<std::string> FitCells(const TrialEstimate& e) {
  if (!e.fit) return {std::string(kNone), std::string(kNone)};
  if (e.fit->micro_batch_size == 0) return {"none", std::string(kNone)};
  return {std::to_string(e.fit->micro_batch_size),
          e.fit->accumulation > 0 ? std::to_string(e.fit->global_micro_batch_size) + " x " +
                                        std::to_string(e.fit->accumulation)
                                  : std::string(kNone)};
}

// step s, tok/s and minutes.
std::vector<std::string> TimeCells(const TrialEstimate& e) {
  if (!e.time) return std::vector<std::string>(3, std::string(kNone));
  return {StepSecondsText(e.time->step_seconds), Grouped(e.time->tokens_per_second, 0),
          e.time->trial_seconds > 0 ? MinutesText(e.time->trial_seconds) : std::string(kNone)};
}

// What the lines under the table say: the devices, calibrations and rates the rows used (each
// once, in the order met) and a note per trial that needs one.
struct TableNotes {
  std::vector<std::string> sources;
  std::vector<std::string> calibrations;
  std::vector<std::string> rates;
  std::string notes;
  // Each way of choosing the micro-batches' lengths (in the order met), with the lines of the
  // trials that chose so: "  NAME: figures".
  std::vector<std::pair<std::string, std::string>> lengths;
  bool slack_kept = false;  // a device whose allocator holds more than it allocates (a GPU's)

  static void AddOnce(std::vector<std::string>& list, const std::string& item) {
    if (std::find(list.begin(), list.end(), item) == list.end()) list.push_back(item);
  }

  void Add(const TrialEstimate& e) {
    if (!e.memory) {
      notes += OnOneLine(e.trial->name) + ": not estimated: " + OnOneLine(e.reason) + "\n";
      return;
    }
    if (e.time) {
      AddOnce(calibrations, e.calibration);
      AddOnce(rates, RatesText(e.rates));
    } else {
      notes += OnOneLine(e.trial->name) + ": no time: " + OnOneLine(e.time_reason) + "\n";
    }
    if (!e.note.empty()) AddLengths(e);
    if (e.device) {
      AddOnce(sources, OnOneLine(e.device->source));
      if (e.device->limit.safe_bytes != e.device->limit.bytes) slack_kept = true;
    }
    if (!e.device) {
      notes += OnOneLine(e.trial->name) +
               ": no verdict: no device_memory, and no GPU from the target (pass --device-memory "
               "80GiB or a GPU such as a100-80gb)\n";
    }
  }

  void AddLengths(const TrialEstimate& e) {
    const std::string how = OnOneLine(e.note.how);
    auto group = std::find_if(lengths.begin(), lengths.end(),
                              [&](const auto& known) { return known.first == how; });
    if (group == lengths.end()) group = lengths.insert(lengths.end(), {how, ""});
    group->second += "  " + OnOneLine(e.trial->name) +
                     (e.note.figures.empty() ? "" : ": " + OnOneLine(e.note.figures)) + "\n";
  }

  std::string Render(const EstimateOptions& options) const {
    std::string text;
    if (!sources.empty()) text += "device: " + Joined(sources) + "\n";
    if (slack_kept) {
      text += "verdict on a GPU: " + estimate::CudaLimitRule() + "\n";
    }
    if (!calibrations.empty()) {
      text +=
          "time: a step (step s) at the mean micro-batch the run draws, else at full sequences, "
          "the trial's tokens/s over its ranks, and minutes for its steps after start-up; "
          "calibration: " +
          Joined(calibrations) + "\nrates: " + Joined(rates) + "\n";
    }
    if (options.fit) {
      text +=
          "max micro-batch: the largest that fits (not tight); global as: the trial's global "
          "batch as micro-batch x accumulation with the largest micro-batch that fits and "
          "divides it\n";
    }
    for (const auto& [how, trials] : lengths) text += "lengths: " + how + ":\n" + trials;
    return text + notes;
  }

  static std::string Joined(const std::vector<std::string>& items) {
    std::string text;
    for (size_t i = 0; i < items.size(); ++i) text += (i > 0 ? "; " : "") + items[i];
    return text;
  }
};

}  // namespace

// Which rates a time is at: a probe's (its description), else the data sheet's.
std::string RatesText(const std::string& rates) {
  return rates.empty() ? "the data sheet's nominal rates" : "measured rates: " + OnOneLine(rates);
}

std::string RenderEstimateTable(const std::string& file, const Experiment& experiment,
                                const std::vector<TrialEstimate>& estimates,
                                const EstimateOptions& options) {
  const std::vector<std::string> header = TableHeader(options);
  std::vector<std::vector<std::string>> rows = {header};
  TableNotes notes;
  for (const TrialEstimate& e : estimates) {
    notes.Add(e);
    std::vector<std::string> row = {OnOneLine(e.trial->name),
                                    OnOneLine(e.trial->config.settings().model.name)};
    if (!e.memory) {
      row.resize(header.size(), std::string(kNone));
    } else {
      for (const std::vector<std::string>& cells :
           {MemoryCells(e), options.fit ? FitCells(e) : std::vector<std::string>(), TimeCells(e)}) {
        row.insert(row.end(), cells.begin(), cells.end());
      }
    }
    rows.push_back(std::move(row));
  }
  std::string text = "estimate of " + OnOneLine(file) + " (" + experiment.name +
                     "): per rank on the training device, MiB\n" +
                     FormatColumns(rows, /*first_right_aligned=*/2) + notes.Render(options);
  if (options.explain) {
    for (const TrialEstimate& e : estimates) {
      if (e.memory) text += "\n" + Explain(e);
    }
  }
  return text + kAssumptions + "\n";
}

std::string RenderEstimateJson(const std::string& file, const Experiment& experiment,
                               const std::vector<TrialEstimate>& estimates,
                               const EstimateOptions& options) {
  ordered_json out = {{"file", file},
                      {"experiment", experiment.name},
                      {"note", kAssumptions},
                      {"trials", ordered_json::array()}};
  for (const TrialEstimate& e : estimates) {
    ordered_json trial = {{"name", e.trial->name},
                          {"model", e.trial->config.settings().model.name},
                          {"estimated", e.memory.has_value()}};
    if (!e.memory) {
      trial["reason"] = e.reason;
      out["trials"].push_back(trial);
      continue;
    }
    const estimate::StepMemoryEstimate& m = *e.memory;
    const estimate::ModelStateEstimate& b = m.state;
    trial.update(ordered_json{{"world_size", b.world_size},
                              {"parameters_total", b.parameters_total},
                              {"parameters_trainable", b.parameters_trainable},
                              {"params_bytes", b.params_bytes},
                              {"grads_bytes", b.grads_bytes},
                              {"optim_device_bytes", b.optim_device_bytes},
                              {"optim_host_bytes", b.optim_host_bytes},
                              {"comm_bytes", b.comm_bytes},
                              {"model_state_bytes", b.device_bytes()},
                              {"tokens", m.tokens},
                              {"activation_bytes", m.activation_bytes},
                              {"peak_bytes", m.peak_bytes},
                              {"peak_phase", m.peak_phase}});
    if (!e.note.empty()) trial["note"] = e.note.Whole();
    if (e.device) {
      trial["device_memory_bytes"] = e.device->bytes;
      trial["device_source"] = e.device->source;
      trial["limit_bytes"] = e.device->limit.bytes;
      trial["safe_limit_bytes"] = e.device->limit.safe_bytes;
      trial["verdict"] = estimate::VerdictName(*e.Verdict());
    } else {
      trial["verdict"] = nullptr;
    }
    if (e.time) {
      trial["time"] = {{"device", e.time_device},
                       {"calibration", e.calibration},
                       {"factor", e.time->factor},
                       {"pace", e.time->pace},
                       {"step_seconds", e.time->step_seconds},
                       {"tokens_per_second", e.time->tokens_per_second},
                       {"startup_seconds", e.time->startup_seconds},
                       {"steps", e.time->steps},
                       {"trial_seconds", e.time->trial_seconds},
                       {"work", e.work->ToJson()}};
      // Only with a probe: without one the JSON is as it was (the data sheets' rates).
      if (!e.rates.empty()) trial["time"]["rates"] = e.rates;
    } else {
      trial["time"] = nullptr;
      trial["time_reason"] = e.time_reason;
    }
    if (options.fit && e.fit) {
      trial["fit"] = {{"micro_batch_size", e.fit->micro_batch_size},
                      {"peak_bytes", e.fit->peak_bytes},
                      {"next_peak_bytes", e.fit->next_peak_bytes},
                      {"global_micro_batch_size", e.fit->global_micro_batch_size},
                      {"accumulation", e.fit->accumulation}};
    }
    if (options.explain) {
      ordered_json terms = ordered_json::array();
      for (const estimate::EstimateTerm& t : m.terms) {
        terms.push_back({{"name", t.name}, {"formula", t.formula}, {"bytes", t.bytes}});
      }
      trial["terms"] = terms;
    }
    out["trials"].push_back(trial);
  }
  // Lossy: it holds the paths and names the user typed, which need not be UTF-8.
  return DumpForTerminal(out, 2) + "\n";
}

}  // namespace llmctl::cli
