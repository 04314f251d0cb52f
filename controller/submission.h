// Turning a submission (the experiment file's text and its uploaded input trees) into what the
// store keeps, and a stored trial back into the inputs an agent needs. No network, no database.
#ifndef LLMCTL_CONTROLLER_SUBMISSION_H_
#define LLMCTL_CONTROLLER_SUBMISSION_H_

#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "common/digest/digest.h"
#include "common/status.h"
#include "common/trial_config.h"
#include "controller/blob_store.h"
#include "controller/store/records.h"

namespace llmctl::controller {

// Parses and validates the experiment exactly as the CLI does (common/experiment.h, with paths kept
// as written) and checks each input tree: ValidateInputTree, and every one of its blobs already
// uploaded to `blobs` (FailedPrecondition naming the input and how many blobs are missing, so the
// CLI knows to upload first). InvalidArgument "FILE:LINE:COLUMN: problem" for the file, and for
// a `filename` that is not printable text of at most kMaxFilenameBytes. Nothing is written
// anywhere.
// `only_trials`, when not empty, keeps only those trials (KeepOnlyTrials).
StatusOr<store::NewExperiment> PrepareSubmission(
    std::string_view yaml_text, std::string_view filename,
    const std::map<std::string, digest::InputTree>& inputs, const BlobStore& blobs,
    const std::vector<std::string>& only_trials = {});

// The most bytes of a submitted file's name (PATH_MAX), which must be printable text
// (PrintableTextProblem).
inline constexpr size_t kMaxFilenameBytes = 4096;

// The most bytes a trial's stored prediction may have (about 2 KiB for the labs' trials), and of
// each of its texts (peak_phase, time_device, calibration): TimedRuns sends up to kMaxTimedRuns
// predictions in one answer, which must stay far under a client's 64 MiB.
inline constexpr size_t kMaxPredictionBytes = 16 << 10;
inline constexpr size_t kMaxPredictionTextBytes = 4096;

// Attaches the CLI's predictions (trial name → TrialPrediction's fields as a JSON object) to the
// experiment's trials. InvalidArgument for a prediction of a trial the file does not have, a
// negative byte count, an unknown verdict, a text that is not printable or is longer than
// kMaxPredictionTextBytes, or a prediction stored over kMaxPredictionBytes; a trial without a
// prediction keeps none.
Status AttachPredictions(const std::map<std::string, nlohmann::json>& predictions,
                         store::NewExperiment& experiment);

// The trial's path keys (`model` and every kPath key of common/trial_keys.h) whose value, as
// written, is one of the experiment's inputs (path as written → tree digest): key → digest.
std::map<std::string, std::string> TrialInputDigests(
    const TrialConfig& config, const std::map<std::string, std::string>& experiment_inputs);

}  // namespace llmctl::controller

#endif  // LLMCTL_CONTROLLER_SUBMISSION_H_
