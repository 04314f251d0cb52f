// Which implementation each fused op (fused_ops.h) ran: its CUDA kernel, its CPU loop, or the ATen
// composition it falls back to where no fused kernel applies, with the reason. A check of the
// kernels must know it: a CUDA test that compared the ATen fallback with ATen itself would pass
// without ever running cuda_kernels.cu (fused_ops_test asserts the implementation), and a trial
// under `kernels: fused` that falls back says so once in its events (the trainer's
// "kernel_fallback" event, through FallbackWatch).
//
// One record per process, written by every call of a fused op (an atomic store on the fused path;
// a lock and the reason's string only on a fallback): ops run on the autograd engine's threads too.
#ifndef LLMCTL_TRAINER_KERNELS_KERNEL_CHOICE_H_
#define LLMCTL_TRAINER_KERNELS_KERNEL_CHOICE_H_

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace llmctl::kernels {

enum class FusedOp { kRmsNorm, kSwiGlu, kSwiGluLinear, kGeGlu, kRope, kCrossEntropy };
inline constexpr int kFusedOpCount = 6;

enum class Implementation { kNone, kCudaKernel, kCpuLoop, kAtenFallback };

// "rms_norm", "swiglu", "swiglu_linear", "geglu", "rope", "cross_entropy".
std::string_view FusedOpName(FusedOp op);
// "none" (never called), "cuda kernel", "cpu loop", "aten fallback".
std::string_view ImplementationName(Implementation implementation);

// fused_ops.cc's record of one call: a fused kernel (kCudaKernel or kCpuLoop),
void RecordKernel(FusedOp op, Implementation implementation);
// or the ATen composition, and why (what of the inputs, the device or the build no kernel takes).
void RecordFallback(FusedOp op, std::string reason);

// The implementation `op`'s latest call in this process ran (kNone before its first call).
Implementation LastImplementation(FusedOp op);
// Why `op` last fell back to ATen ("" if it never did).
std::string LastFallbackReason(FusedOp op);

// Whether this build compiled cuda_kernels.cu (trainer/CMakeLists.txt, LLMCTL_CUDA_KERNELS):
// without it every fused op on a CUDA tensor falls back to ATen. Defined in fused_ops.cc, the one
// file the build tells.
bool CudaKernelsBuilt();

struct Fallback {
  FusedOp op;
  std::string reason;
};

// The ops that fell back to ATen since the watch was made, each reported once: what a trial run
// under `kernels: fused` says in its events.
class FallbackWatch {
 public:
  FallbackWatch();
  // The ops that fell back since the watch was made and were not returned before, each with its
  // latest reason.
  std::vector<Fallback> TakeNew();

 private:
  std::array<int64_t, kFusedOpCount> fallbacks_seen_;  // -1 once reported
};

}  // namespace llmctl::kernels

#endif  // LLMCTL_TRAINER_KERNELS_KERNEL_CHOICE_H_
