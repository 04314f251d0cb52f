// The trainer's `kernel_fallback` event: a fused op (trainer/kernels/kernel_choice.h) that ran
// ATen's composition instead of its kernel, because of its inputs' dtype, their device or the build
// (llm-train built without its CUDA kernels). Written once per op and trial, at the end of the
// first step the op fell back in; `llmctl report` names it under the trial. One spelling for the
// trainer that writes it and the controller that reads it.
#ifndef LLMCTL_COMMON_KERNEL_FALLBACK_EVENT_H_
#define LLMCTL_COMMON_KERNEL_FALLBACK_EVENT_H_

#include <string_view>

namespace llmctl::kernel_fallback_event {

inline constexpr std::string_view kType = "kernel_fallback";
// The op: "rms_norm", "swiglu", "swiglu_linear", "geglu", "rope" or "cross_entropy".
inline constexpr std::string_view kOp = "op";
// Why no fused kernel took it, e.g. "dtype Double (the fused kernels take float32, bfloat16 and
// float16)".
inline constexpr std::string_view kReason = "reason";
// The step (from 0) it was first seen in.
inline constexpr std::string_view kStep = "step";

}  // namespace llmctl::kernel_fallback_event

#endif  // LLMCTL_COMMON_KERNEL_FALLBACK_EVENT_H_
