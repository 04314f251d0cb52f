// `llmctl report --format csv`: a row per trial, its figures at full precision.
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/text.h"
#include "controller/cli/report.h"
#include "controller/cli/report_renderers.h"
#include "controller/cli/report_rows.h"

namespace llmctl::cli {
namespace {

// Whether `text` is one of the figures this file writes (an integer or a JSON number), not text.
bool IsNumber(const std::string& text) {
  const nlohmann::json parsed = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  return !parsed.is_discarded() && parsed.is_number();
}

std::string CsvField(const std::string& raw) {
  // The controller's words (a trial's name, an error, a kernel's fallback reason) are other
  // processes' text, and `report --format csv` goes to the terminal as often as to a file: one
  // line, without the control characters that would move its cursor or retitle it.
  const std::string text = OnOneLine(raw);
  // Text a spreadsheet would take for a formula is kept as text, as OWASP's CSV-injection advice
  // does: a leading apostrophe (its tab and CR are spaces by now).
  const bool formula = !text.empty() &&
                       std::string_view("=+-@").find(text[0]) != std::string_view::npos &&
                       !IsNumber(text);
  const std::string field = formula ? "'" + text : text;
  if (field.find_first_of(",\"") == std::string::npos) return field;
  std::string quoted = "\"";
  for (char c : field) quoted += c == '"' ? std::string("\"\"") : std::string(1, c);
  return quoted + "\"";
}

std::string Number(double value) { return nlohmann::json(value).dump(); }

}  // namespace

std::string RenderCsv(const v1::ReportResponse& report) {
  std::string out =
      "trial,description,expected,outcome,attempt,node,params_bytes,grads_bytes,"
      "optim_device_bytes,optim_host_bytes,comm_bytes,gathered_bytes,other_bytes,allocated_bytes,"
      "reserved_bytes,peak_bytes,train_seconds,tokens_per_second,final_loss,error,ranks,rank_peak_"
      "bytes,"
      "rank_phase_allocated_bytes,predicted_peak_bytes,predicted_verdict,prediction_error,"
      "steady_tokens_per_second,predicted_tokens_per_second,tokens_per_second_prediction_error,"
      "others_cpu_share,steady_step_variation,machine_pace,"
      "tokens_per_second_prediction_error_at_pace\n";
  for (const v1::TrialReport& trial : report.trials()) {
    std::vector<std::string> fields = {trial.name(),
                                       trial.description(),
                                       trial.expected(),
                                       trial.outcome(),
                                       std::to_string(trial.attempt()),
                                       trial.node()};
    if (trial.has_at_peak()) {
      const v1::MemorySnapshot& snap = trial.at_peak();
      for (int64_t bytes : {snap.params_bytes(), snap.grads_bytes(), snap.optim_device_bytes(),
                            snap.optim_host_bytes(), snap.comm_bytes(), snap.gathered_bytes(),
                            snap.other_bytes(), snap.allocated_bytes(), snap.reserved_bytes()}) {
        fields.push_back(std::to_string(bytes));
      }
    } else {
      fields.insert(fields.end(), 9, "");
    }
    const bool ended = HasEnded(trial);
    fields.push_back(ended ? std::to_string(trial.peak_bytes()) : "");
    fields.push_back(ended ? Number(trial.train_seconds()) : "");
    const std::optional<double> whole_run = MeasuredRate(trial, trial.tokens_per_second());
    fields.push_back(whole_run ? Number(*whole_run) : "");
    fields.push_back(trial.has_final_loss() ? Number(trial.final_loss()) : "");
    fields.push_back(trial.error());
    // A multi-rank trial: the rank count, each rank's peak ("45331104;45400000", rank order) and
    // each rank's per-phase most allocated bytes ("0:phase0_before_fwd=...|phase1...;1:...").
    std::string rank_peaks;
    std::string rank_phases;
    for (const v1::RankMemory& rank : trial.ranks()) {
      if (!rank_peaks.empty()) rank_peaks += ';';
      rank_peaks += std::to_string(rank.peak_bytes());
      if (!rank_phases.empty()) rank_phases += ';';
      rank_phases += std::to_string(rank.rank()) + ":";
      for (int i = 0; i < rank.per_phase_size(); ++i) {
        if (i > 0) rank_phases += '|';
        rank_phases +=
            rank.per_phase(i).phase() + "=" + std::to_string(rank.per_phase(i).allocated_bytes());
      }
    }
    fields.push_back(trial.ranks_size() > 0 ? std::to_string(trial.ranks_size()) : "");
    fields.push_back(rank_peaks);
    fields.push_back(rank_phases);
    // What the estimate predicted at submit (empty when it did not), and its error as a fraction.
    fields.push_back(trial.has_prediction() ? std::to_string(trial.prediction().peak_bytes()) : "");
    fields.push_back(trial.has_prediction() ? trial.prediction().verdict() : "");
    const std::optional<double> error = PredictionError(trial);
    fields.push_back(error ? Number(*error) : "");
    // The table's tokens/s (each attempt's first step left out) beside its prediction, as the JSON
    // has them: tokens_per_second alone is the whole run's, which the table does not show.
    const std::optional<double> steady = MeasuredRate(trial, SteadyTokensPerSecond(trial));
    fields.push_back(steady ? Number(*steady) : "");
    const bool timed = trial.has_prediction() && trial.prediction().step_seconds() > 0;
    fields.push_back(timed ? Number(trial.prediction().tokens_per_second()) : "");
    const std::optional<double> time_error = TimePredictionError(trial);
    fields.push_back(time_error ? Number(*time_error) : "");
    // What others took of the machine's CPU over the steady steps (report_rows.h's
    // OthersCpuShare), empty where the tokens/s is.
    const std::optional<double> others = OthersCpuShare(trial);
    fields.push_back(others ? Number(*others) : "");
    // How much the steady steps' time a token moved (StepVariation), empty where it is none.
    const std::optional<double> variation = StepVariation(trial);
    fields.push_back(variation ? Number(*variation) : "");
    // The machine's pace against the probe's (MachinePace) and the error at it, empty without.
    const std::optional<double> pace = MachinePace(trial);
    fields.push_back(pace ? Number(*pace) : "");
    const std::optional<double> paced_error = TimePredictionErrorAtPace(trial);
    fields.push_back(paced_error ? Number(*paced_error) : "");
    for (size_t i = 0; i < fields.size(); ++i) {
      out += CsvField(fields[i]) + (i + 1 < fields.size() ? "," : "\n");
    }
  }
  return out;
}

}  // namespace llmctl::cli
