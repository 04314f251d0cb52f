// The experiment file an agent writes for one run: a one-trial file that llm-train accepts.
#ifndef LLMCTL_AGENT_TRIAL_FILE_H_
#define LLMCTL_AGENT_TRIAL_FILE_H_

#include <cstdint>
#include <map>
#include <string>

#include "common/status.h"

namespace llmctl::agent {

struct TrialFile {
  std::string yaml;    // nested like the experiment files; only the keys the experiment set
  std::string device;  // the trial's `device` ("cpu", "cuda")
  // The worker processes (ranks) the trial runs as: its `devices` for a data-parallel strategy
  // (ddp, fsdp) with more than one device, started through llm-train --nproc; else 1.
  int ranks = 1;
  int64_t nodes = 1;  // the trial's `nodes`: the nodes its ranks are spread over, `ranks` on each
  // Each input's path on this node → the value the experiment wrote for it, for llm-train's
  // --input-name: messages name the user's path, not the agent's cache.
  std::map<std::string, std::string> input_names;
};

// `config_json` is TrialConfig::ToJson as the controller stored it; it is checked with
// TrialConfig::FromJson (InvalidArgument naming the bad key). `input_paths` maps trial keys to
// paths on this node that replace their values: only path keys and `model` may be inputs; two
// keys on one path written two ways name it "A or B" in input_names.
// output_dir becomes `default_output_dir` (the run's output/) when unset, and the path below it
// when relative; one that would leave it (OutputDirInRun) is InvalidArgument. The file carries the
// keys that were set (TrialConfig::ToJson) and no others, so llm-train sees which keys the
// experiment set, as its checks need, and fills in the rest from the same registry's defaults.
StatusOr<TrialFile> MakeTrialFile(const std::string& config_json,
                                  const std::map<std::string, std::string>& input_paths,
                                  const std::string& default_output_dir);

}  // namespace llmctl::agent

#endif  // LLMCTL_AGENT_TRIAL_FILE_H_
