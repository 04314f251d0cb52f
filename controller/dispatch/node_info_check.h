// What the controller accepts of an agent's GetNodeInfo answer: another process's description of
// its node, which the store keeps, placement counts devices from, notices repeat for every waiting
// trial, and `llmctl nodes` prints.
#ifndef LLMCTL_CONTROLLER_DISPATCH_NODE_INFO_CHECK_H_
#define LLMCTL_CONTROLLER_DISPATCH_NODE_INFO_CHECK_H_

#include <string>

#include "common/status.h"
#include "llmctl/v1/agent.pb.h"

namespace llmctl::controller::dispatch {

// More devices than any node has (an 8-GPU node lists 9 with its CPU).
inline constexpr int kMaxNodeDevices = 1024;

// InvalidArgument naming the first field that is not a node's: more than kMaxNodeDevices devices;
// a device whose type is not cpu or cuda, whose index is negative or repeats its type's, whose
// memory is negative, or whose name is not printable text of at most 256 bytes; a negative host
// memory or CPU count; a version that is not printable text of at most 64 bytes (the driver's,
// LibTorch's and their CUDA versions), 256 (llmctl's and llm-train's) or a pending probe's note
// or the agent's reason it is unusable not of at most 1,024.
Status CheckNodeInfo(const v1::NodeInfo& info);

// InvalidArgument when an agent's MeasureRates answer is not what the controller takes of a
// pending probe's note in NodeInfo (printable text of at most kRateProbePendingMaxBytes).
Status CheckMeasureRatesAnswer(const v1::MeasureRatesResponse& answer);

// FailedPrecondition when `node`'s agent reports another llmctl version than this controller's
// (kVersion), "" included: the two must be the same release, as a trial's settings mean what the
// agent's llm-train makes of them and a setting it does not know fails only once the trial runs
// there (docs/architecture.md, "Versions"). The message names both versions and how to redeploy.
Status CheckAgentVersion(const std::string& node, const std::string& agent_version);

}  // namespace llmctl::controller::dispatch

#endif  // LLMCTL_CONTROLLER_DISPATCH_NODE_INFO_CHECK_H_
