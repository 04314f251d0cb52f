// Experiment files: a base training config plus a list of trials that edit it, in YAML.
//
//   name: single-gpu-lab                  # optional; default: the file name without extension
//   description: ...                      # optional
//   target: {site: KVM@TACC, flavor: g1.h100.pci.1}   # optional map of strings
//   model: tinyllama-1.1b                 # the base config: any trial keys (trial_keys.h),
//   train: {micro_batch_size: 16}         #   as nested maps or dotted names
//   trials:                               # optional; absent: one trial named after the file
//     - name: baseline                    # required, unique; letters, digits, '.', '_', '-'
//       description: ...                  # optional
//       set: {train.micro_batch_size: 64} # optional edits of the base, nested or dotted
//       expect: oom                       # optional: oom | ok
//   sweep:                                # optional: each trial runs once per combination
//     precision: [32-true, bf16-true]
//
// Precedence, lowest first: registry defaults, the base config, the trial's `set`, the sweep's
// values. A trial may not `set` a key that the sweep varies (one of the two would be silently
// ignored). With a sweep, trial names get the values as a suffix: "baseline/precision=bf16-true"
// (keys joined with ',' in the order the sweep lists them; the first key varies slowest). Without
// `trials:`, the sweep's trials are named "<experiment>/<key>=<value>".
//
// Relative paths: data.path, tokenizer, output_dir (unless output_dir_in_run) and a `model` that
// is not a preset are looked up relative to the directory of the experiment file first; when the
// file exists there the value becomes that joined path (e.g. "experiments/data/x.jsonl" for
// "data/x.jsonl" in "experiments/demo.yaml"), otherwise it is kept exactly as written (and so is
// relative to the current directory). Preset names always win over a directory of the same name. A
// value written node:/abs/path is on the node (trial_keys.h, kNodePathPrefix) and never resolved
// here. Parsing does not check that files exist: common/inputs/trial_inputs.h does, for llm-train
// and `llmctl submit` alike.
//
// Each trial is validated after its values are combined (ValidateTrialConfig), with the model's
// shape when the model can be resolved (a preset, or a directory's config.json).
//
// Errors are one line, "FILE:LINE:COLUMN: problem" (1-based), pointing at the offending key or
// value: unknown keys (with "did you mean"), wrong types, bad enum values (listing the allowed
// ones), duplicate keys or trial names, an empty trials list, YAML syntax errors, and per-trial
// impossible combinations, which name the trial and point where the offending key was written (in
// the trial's `set:`, the sweep, or the base config).
#ifndef LLMCTL_COMMON_EXPERIMENT_H_
#define LLMCTL_COMMON_EXPERIMENT_H_

#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "common/trial_config.h"
#include "common/trial_keys.h"

namespace llmctl {

struct Trial {
  std::string name;
  std::string description;
  TrialConfig config;                 // complete: defaults, base, set and sweep values combined
  std::optional<std::string> expect;  // "oom" or "ok" when the file states what should happen
};

struct Experiment {
  std::string name;
  std::string description;
  std::map<std::string, std::string> target;
  std::vector<Trial> trials;  // in file order, sweep combinations of one trial together
};

struct ExperimentParseOptions {
  // True where the experiment file's directory is on this machine (the CLI, the trainer): relative
  // paths are resolved against it and a model directory's config.json is read for model-dependent
  // checks. False where only the text arrived (the controller): paths stay as written, and a model
  // that is not a preset is taken on trust, skipping the checks that need its shape.
  bool resolve_local_paths = true;
  // True where the file is run through llmctl (`llmctl submit`, the controller): each trial runs
  // in its own directory on a node, so output_dir must be a relative path inside that run's
  // output/ (OutputDirInRun), refused at its line otherwise, and is not resolved against the
  // file's directory. False for llm-train alone, where output_dir may be any directory.
  bool output_dir_in_run = false;
};

// Parses and validates an experiment. `filename` is used in messages and, unless the options say
// otherwise, as the base for relative paths. InvalidArgument "FILE:LINE:COLUMN: problem" on any
// error.
StatusOr<Experiment> ParseExperiment(std::string_view yaml_text, std::string_view filename,
                                     const ExperimentParseOptions& options = {});

// Keeps only the trials named in `names`, in the file's order (`llmctl submit --trial`, after the
// whole file was parsed and checked). A name the experiment does not have is an InvalidArgument
// naming `filename` and its trials.
Status KeepOnlyTrials(const std::vector<std::string>& names, std::string_view filename,
                      Experiment& experiment);

// Experiment files are a few KB; a bigger one is a wrong path, refused before it is read whole.
inline constexpr size_t kMaxExperimentFileBytes = 4 << 20;

// An experiment's or trial's name made of `text` (a directory's name, say "my model: 'q' #1"):
// each run of characters a name may not hold becomes one '-' between the characters it may hold
// ("my-model-q-1"), cut to a name's 100 bytes; empty when `text` holds none.
std::string NameFrom(std::string_view text);

// Reads `path` (a regular file of at most kMaxExperimentFileBytes) and parses it. NotFound when
// the file is missing; InvalidArgument when it is a directory, device or FIFO.
StatusOr<Experiment> LoadExperimentFile(const std::string& path,
                                        const ExperimentParseOptions& options = {});

// True when `value` of key `spec` names a file or directory: every kPath key, and `model` when the
// value is neither a preset (LLaMA family or BLIP-2) nor a hub reference (hf:ORG/NAME).
bool IsPathValue(const KeySpec& spec, std::string_view value);

// True for the path values a trial reads (model, tokenizer, data, adapter) from the machine where
// the experiment file is: IsPathValue less output_dir, which the trial writes, and node paths
// (kNodePathPrefix), which are on the node already. The CLI checks and uploads these.
bool IsInputPathValue(const KeySpec& spec, std::string_view value);

// Under llmctl a trial writes only inside its run's output/ directory, which is all that `llmctl
// fetch` and the checkpoint copy see, and where the agent (root) may write: output_dir is a path
// relative to it. `written` lexically normalised ("." for output/ itself, also when empty), or
// InvalidArgument "output_dir: ..." when it would leave output/: an absolute or node: path, or one
// whose ".." climbs out. The experiment parser (output_dir_in_run) and the agent both check it.
StatusOr<std::string> OutputDirInRun(std::string_view written);

// Where a path value written in the experiment file `filename` is on this machine, by the "Relative
// paths" rule above: beside the file when it exists there, else exactly as written.
std::string ResolveLocalPath(std::string_view filename, std::string_view written);

// Where the trial runs (llm-train), node paths are local: each value node:/abs/path becomes
// /abs/path. Parsing keeps them as written everywhere, and takes a model named by one on trust.
void LocalizeNodePaths(TrialConfig& config);

}  // namespace llmctl

#endif  // LLMCTL_COMMON_EXPERIMENT_H_
