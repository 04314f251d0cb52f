// experiments/demo.yaml run as a user runs a data-parallel trial: `llm-train --nproc N` (the
// launcher gives each rank its share of the CPUs and the rendezvous a port the kernel picks), one
// launcher per node of a multi-node trial (on loopback), or one process, with every rank's events
// and the final checkpoint read back. For the strategies' tests (ddp_test, fsdp_test), which
// compare N ranks against one process, and N ranks on one node against the same on several.
#ifndef LLMCTL_TRAINER_TESTING_RANKED_DEMO_H_
#define LLMCTL_TRAINER_TESTING_RANKED_DEMO_H_

#include <sys/types.h>
#include <torch/torch.h>

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace llmctl::trainer::testing {

struct RankedDemoRun {
  int exit_code = -1;  // a multi-node run's: the first node's that is not 0
  // A multi-node run's, by node rank; -1: killed by a signal, or not started.
  std::vector<int> node_exit_codes;
  std::string output;  // stdout and stderr of llm-train (every node's, every rank's)
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

// What share of a tensor's elements may end a run beyond 1e-5 of the other side's under 8-bit
// AdamW. Its moments are requantised to the nearest of 256 codes each step; the two sides sum the
// micro-batches and ranks in different orders, so their gradients differ in the last bits, and an
// element whose new moment lies on a rounding boundary between two codes lands on one code here and
// the other there: its update then differs by a code step, far beyond 1e-5. Such elements are rare
// (at most 2 of 8,192 in a tensor of the demo's 3 steps); state blocks cut anywhere but at block
// boundaries move every element of the blocks they cut (2% to 20% of the demo's tensors).
inline constexpr double kEightBitStrayFraction = 1e-3;

// 2 ranks of `strategy` with the `two` sets against 1 process with the `one` sets (twice the
// micro-batch): the same examples in each step, so, with the gradients averaged, the same losses on
// every rank and the same final weights (the checkpoint's, in Hugging Face names) up to the two
// summation orders, which the arithmetic bounds (adam_step_bound.h): per element under AdamW, per
// tensor under SGD without momentum, from the one process's checkpoint after every step and a
// third run, the one process with the ranks' micro-batch accumulated, that samples this machine's
// rounding, plus each step's float32 rounding of the weights per element; a loss within its
// gradient times those bounds plus 64 times its rounding. Tensors
// neither run trains are equal. Other optimizers (8-bit AdamW) keep a fixed 1e-5 for all but
// `stray_fraction` of each tensor's elements (kEightBitStrayFraction). The loss must move, or
// equal losses would say nothing about the updates. Each run takes `steps` steps (at least 2: the
// steps after the first tell which tensor AdamW's state by index belongs to). The third run must
// draw the same examples at each step as the one process (the test fails when a step's label tokens
// differ): with drop_last, a step of accumulated micro-batches straddles an epoch end that a step
// of one micro-batch drops unless the data hold a whole number of global batches. The two compared
// runs go to `single_run` and `ranked_run` when given.
void ExpectTwoRanksTrainLikeOneProcess(const std::string& strategy, const std::string& name,
                                       const std::vector<std::string>& one,
                                       const std::vector<std::string>& two, int64_t steps,
                                       double stray_fraction = 0.0,
                                       RankedDemoRun* single_run = nullptr,
                                       RankedDemoRun* ranked_run = nullptr);

// The demo as `nodes` llm-train launchers of `devices` ranks each on this host, the way the agents
// of `nodes` hosts start their shares of a multi-node trial: node rank 0 with --master-port 0 and a
// ranks file, then each other node, once the port is recorded there, with --master-addr 127.0.0.1
// and that port. The trial's strategy, devices and nodes are set; `sets` and `steps` as above.
// The nodes share the output_dir <dir>/out (a filesystem the hosts share) unless `output_dirs`
// gives each node rank its own (hosts that share none, as the agents' run directories are).
class MultiNodeDemo {
 public:
  MultiNodeDemo(const std::string& strategy, const std::string& name, int nodes, int devices,
                const std::vector<std::string>& sets, int64_t steps,
                std::vector<std::string> output_dirs = {});
  // A launcher still running is killed (its ranks die with it).
  ~MultiNodeDemo();
  MultiNodeDemo(const MultiNodeDemo&) = delete;
  MultiNodeDemo& operator=(const MultiNodeDemo&) = delete;

  // Node rank `node`'s ranks file once its launcher has written it (all its ranks started); null
  // when the launcher ended without writing it.
  nlohmann::json AwaitRanksFile(int node);
  // Waits until global rank `rank` has logged a step event; false when its node's launcher ended
  // first.
  bool AwaitStep(int rank);
  // Waits for every launcher and reads the run back.
  RankedDemoRun Finish();

 private:
  void Start(int node, int master_port);
  // Reaps node `node`'s launcher if it has ended; true when it has.
  bool Ended(int node);

  int nodes_;
  int devices_;
  int64_t steps_;
  std::vector<std::string> args_;         // llm-train's, without the launcher flags
  std::vector<std::string> output_dirs_;  // by node rank; empty when they share <dir>/out
  std::string dir_;
  std::vector<pid_t> launchers_;  // by node rank; -1 when not started or reaped
  std::vector<int> exit_codes_;
};

// The events of `type`, in order.
std::vector<nlohmann::json> EventsOfType(const std::vector<nlohmann::json>& events,
                                         const std::string& type);

// The step events' losses, in order.
std::vector<double> StepLosses(const std::vector<nlohmann::json>& events);

}  // namespace llmctl::trainer::testing

#endif  // LLMCTL_TRAINER_TESTING_RANKED_DEMO_H_
