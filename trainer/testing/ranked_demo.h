// experiments/demo.yaml run as a user runs a data-parallel trial: `llm-train --nproc N` (the
// launcher gives each rank its share of the CPUs and the rendezvous a port the kernel picks), or
// one process, with every rank's events and the final checkpoint read back. For the strategies'
// tests (ddp_test, fsdp_test), which compare N ranks against one process.
#ifndef LLMCTL_TRAINER_TESTING_RANKED_DEMO_H_
#define LLMCTL_TRAINER_TESTING_RANKED_DEMO_H_

#include <torch/torch.h>

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace llmctl::trainer::testing {

struct RankedDemoRun {
  int exit_code = -1;
  std::string output;  // stdout and stderr of llm-train (every rank's)
  std::string dir;     // events.jsonl (and events.rank<r>.jsonl), out/
  std::vector<std::vector<nlohmann::json>> events;   // per rank
  std::map<std::string, torch::Tensor> final_model;  // the checkpoint after the last step
};

// The demo for `steps` steps with `sets` (key=value), a snapshot every phase and a checkpoint after
// the last step (unless `sets` names checkpoint_every), as `ranks` ranks of `strategy` or, with
// ranks 1, one process. `extra_flags` is appended to the command line.
RankedDemoRun RunRankedDemo(const std::string& strategy, const std::string& name, int ranks,
                            const std::vector<std::string>& sets, int64_t steps,
                            const std::string& extra_flags = "");

// 2 ranks of `strategy` with the `two` sets against 1 process with the `one` sets (twice the
// micro-batch): the same examples in each step, so the same losses on every rank and, with the
// gradients averaged, the same final weights (the checkpoint's, in Hugging Face names), within
// 1e-5 in fp32; and the loss moves, or equal losses would say nothing about the updates. Each run
// takes `steps` steps.
void ExpectTwoRanksTrainLikeOneProcess(const std::string& strategy, const std::string& name,
                                       const std::vector<std::string>& one,
                                       const std::vector<std::string>& two, int64_t steps);

// The events of `type`, in order.
std::vector<nlohmann::json> EventsOfType(const std::vector<nlohmann::json>& events,
                                         const std::string& type);

// The step events' losses, in order.
std::vector<double> StepLosses(const std::vector<nlohmann::json>& events);

}  // namespace llmctl::trainer::testing

#endif  // LLMCTL_TRAINER_TESTING_RANKED_DEMO_H_
