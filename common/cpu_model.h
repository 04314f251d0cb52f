// The CPU's model name as /proc/cpuinfo gives it ("AMD EPYC 7763 64-Core Processor"): how a node
// and a rate probe name the processor they describe.
#ifndef LLMCTL_COMMON_CPU_MODEL_H_
#define LLMCTL_COMMON_CPU_MODEL_H_

#include <string>

namespace llmctl {

// "cpu" when /proc/cpuinfo has no model name (not Linux, or an architecture that names none).
std::string CpuModelName();

}  // namespace llmctl

#endif  // LLMCTL_COMMON_CPU_MODEL_H_
