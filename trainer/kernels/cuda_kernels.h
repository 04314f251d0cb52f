// The fused kernels' CUDA launchers (cuda_kernels.cu, compiled by nvcc when the CUDA toolkit is
// found: LLMCTL_HAVE_CUDA_KERNELS). Plain pointers and sizes, no LibTorch, so that nvcc never
// parses LibTorch's headers; fused_ops.cc checks the tensors and passes the current stream. Each
// returns nullptr, or CUDA's error string when the launch failed.
#ifndef LLMCTL_TRAINER_KERNELS_CUDA_KERNELS_H_
#define LLMCTL_TRAINER_KERNELS_CUDA_KERNELS_H_

#include <cstdint>

#include "trainer/kernels/row_math.h"  // GluActivation

namespace llmctl::kernels::cuda {

using ::llmctl::kernels::GluActivation;

// The tensors' element type: every tensor of a call has it, but RMSNorm's rstd (fp32) and the
// rotary tables (fp32).
enum class Element { kFloat32, kBFloat16, kFloat16 };

// x, weight, y: (rows, cols); rstd: (rows,) fp32.
const char* RmsNormForward(Element element, const void* x, const void* weight, void* y, float* rstd,
                           int64_t rows, int64_t cols, float eps, void* stream);
// dx (rows, cols) from x, weight, rstd and dy; the weight's gradient is the caller's.
const char* RmsNormBackward(Element element, const void* x, const void* weight, const float* rstd,
                            const void* dy, void* dx, int64_t rows, int64_t cols, void* stream);
// h = act(g) * u over n elements (SwiGLU, gated-GELU), and its gradients.
const char* GluForward(GluActivation activation, Element element, const void* g, const void* u,
                       void* h, int64_t n, void* stream);
const char* GluBackward(GluActivation activation, Element element, const void* g, const void* u,
                        const void* dh, void* dg, void* du, int64_t n, void* stream);
// x, y: (batch, seq, heads, dim) contiguous; cos, sin: (seq, dim) fp32. `inverse` rotates back
// (the backward: x is the output's gradient, y the input's).
const char* Rope(Element element, const void* x, const float* cos, const float* sin, void* y,
                 int64_t batch, int64_t seq, int64_t heads, int64_t dim, bool inverse,
                 void* stream);

// In place over logits (rows, cols): cpu_kernels.h's CrossEntropyGrad, with `scale` a device
// scalar; a label outside [0, cols) other than `ignore` gives its row a NaN loss.
const char* CrossEntropyGrad(Element element, void* logits, const int64_t* labels,
                             const float* scale, float* row_loss, int64_t rows, int64_t cols,
                             int64_t ignore, void* stream);

}  // namespace llmctl::kernels::cuda

#endif  // LLMCTL_TRAINER_KERNELS_CUDA_KERNELS_H_
