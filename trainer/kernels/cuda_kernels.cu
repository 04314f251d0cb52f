#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <type_traits>

#include "trainer/kernels/cuda_kernels.h"
#include "trainer/kernels/row_math.h"

namespace llmctl::kernels::cuda {
namespace {

namespace math = ::llmctl::kernels;  // row_math.h, whose names the launchers reuse

constexpr int kThreads = 256;

__device__ inline float Load(const float* p, int64_t i) { return p[i]; }
__device__ inline float Load(const __nv_bfloat16* p, int64_t i) { return __bfloat162float(p[i]); }
__device__ inline float Load(const __half* p, int64_t i) { return __half2float(p[i]); }
__device__ inline void Store(float* p, int64_t i, float v) { p[i] = v; }
__device__ inline void Store(__nv_bfloat16* p, int64_t i, float v) { p[i] = __float2bfloat16(v); }
__device__ inline void Store(__half* p, int64_t i, float v) { p[i] = __float2half(v); }

// The sum of `value` over the block's threads, for every thread.
__device__ float BlockSum(float value) {
  __shared__ float partial[kThreads / 32];
  for (int offset = 16; offset > 0; offset /= 2)
    value += __shfl_down_sync(0xffffffff, value, offset);
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  if (lane == 0) partial[warp] = value;
  __syncthreads();
  float total = 0.0f;
  for (int w = 0; w < kThreads / 32; ++w) total += partial[w];
  __syncthreads();  // `partial` is reused by the next call
  return total;
}

// The maximum of `value` over the block's threads, for every thread.
__device__ float BlockMax(float value) {
  __shared__ float partial[kThreads / 32];
  for (int offset = 16; offset > 0; offset /= 2)
    value = fmaxf(value, __shfl_down_sync(0xffffffff, value, offset));
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  if (lane == 0) partial[warp] = value;
  __syncthreads();
  float result = partial[0];
  for (int w = 1; w < kThreads / 32; ++w) result = fmaxf(result, partial[w]);
  __syncthreads();
  return result;
}

// One block a row.
template <typename T>
__global__ void RmsNormForwardKernel(const T* x, const T* weight, T* y, float* rstd, int64_t cols,
                                     float eps) {
  const int64_t row = blockIdx.x;
  const T* in = x + row * cols;
  float squares = 0.0f;
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
    const float v = Load(in, j);
    squares += v * v;
  }
  const float r = math::RowRstd(BlockSum(squares), cols, eps);
  if (threadIdx.x == 0) rstd[row] = r;
  T* out = y + row * cols;
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
    // The normalised value is rounded to the input's dtype before the weight scales it, as
    // transformers' (x * rstd).to(dtype) does.
    T normed;
    Store(&normed, 0, Load(in, j) * r);
    Store(out, j, Load(weight, j) * Load(&normed, 0));
  }
}

template <typename T>
__global__ void RmsNormBackwardKernel(const T* x, const T* weight, const float* rstd, const T* dy,
                                      T* dx, int64_t cols) {
  const int64_t row = blockIdx.x;
  const T* in = x + row * cols;
  const T* grad = dy + row * cols;
  float dot = 0.0f;
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
    dot += Load(grad, j) * Load(weight, j) * Load(in, j);
  }
  const float dot_over_n = BlockSum(dot) / static_cast<float>(cols);
  const float r = rstd[row];
  T* out = dx + row * cols;
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
    Store(out, j,
          math::RmsNormInputGrad(Load(in, j), Load(grad, j) * Load(weight, j), r, dot_over_n));
  }
}

template <math::GluActivation A, typename T>
__global__ void GluForwardKernel(const T* g, const T* u, T* h, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    Store(h, i, math::Glu<A>::Forward(Load(g, i), Load(u, i)));
  }
}

template <math::GluActivation A, typename T>
__global__ void GluBackwardKernel(const T* g, const T* u, const T* dh, T* dg, T* du, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float grad_g = 0.0f;
    float grad_u = 0.0f;
    math::Glu<A>::Backward(Load(g, i), Load(u, i), Load(dh, i), &grad_g, &grad_u);
    Store(dg, i, grad_g);
    Store(du, i, grad_u);
  }
}

// One thread a pair (x[i], x[i + dim / 2]) of a (batch, seq, heads) row.
template <typename T>
__global__ void RopeKernel(const T* x, const float* cos, const float* sin, T* y, int64_t rows,
                           int64_t seq, int64_t heads, int64_t dim, bool inverse) {
  const int64_t half = dim / 2;
  for (int64_t p = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; p < rows * half;
       p += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t row = p / half;
    const int64_t i = p % half;
    const int64_t t = (row / heads) % seq;
    const float c = cos[t * dim + i];
    const float s = sin[t * dim + i];
    const T* in = x + row * dim;
    float a = 0.0f;
    float b = 0.0f;
    if (inverse) {
      math::RotateBack(Load(in, i), Load(in, i + half), c, s, &a, &b);
    } else {
      math::Rotate(Load(in, i), Load(in, i + half), c, s, &a, &b);
    }
    Store(y + row * dim, i, a);
    Store(y + row * dim, i + half, b);
  }
}

// One block a row of logits: its loss, and in place its gradient (cpu_kernels.h's
// CrossEntropyGrad). `scale` is a device scalar (the reciprocal of the count of scored labels).
template <typename T>
__global__ void CrossEntropyGradKernel(T* logits, const int64_t* labels, const float* scale,
                                       float* row_loss, int64_t cols, int64_t ignore) {
  const int64_t row = blockIdx.x;
  T* x = logits + row * cols;
  const int64_t target = labels[row];
  if (target == ignore) {
    for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) Store(x, j, 0.0f);
    if (threadIdx.x == 0) row_loss[row] = 0.0f;
    return;
  }
  float row_max = -INFINITY;
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) row_max = fmaxf(row_max, Load(x, j));
  row_max = BlockMax(row_max);
  float sum = 0.0f;
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) sum += math::Exp(Load(x, j) - row_max);
  const bool in_range = target >= 0 && target < cols;
  // Read before BlockSum's barrier: after it, the target's element is overwritten.
  const float x_target = threadIdx.x == 0 && in_range ? Load(x, target) : 0.0f;
  const float lse = math::RowLogSumExp(row_max, BlockSum(sum));
  if (threadIdx.x == 0) row_loss[row] = in_range ? lse - x_target : NAN;
  const float s = *scale;
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
    const float v = Load(x, j);
    Store(x, j,
          j == target ? math::CrossEntropyTargetLogitGrad(v, lse, s)
                      : math::CrossEntropyLogitGrad(v, lse, s));
  }
}

// The launches of one block a row take at most this many rows: gridDim.x's limit. Beyond it
// `<<<rows, ...>>>` would convert the int64 count to dim3's unsigned silently (2^32 + 1 rows
// launching one block) where it should fail; 8 x 1024 tokens are 8,192 rows.
constexpr int64_t kMaxRowBlocks = (int64_t{1} << 31) - 1;
constexpr char kTooManyRows[] = "more rows than a grid has blocks (2^31 - 1), one block a row";

int Blocks(int64_t n) {
  const int64_t blocks = (n + kThreads - 1) / kThreads;
  return static_cast<int>(blocks < 65535 * 16 ? (blocks > 0 ? blocks : 1) : 65535 * 16);
}

const char* LastError() {
  const cudaError_t error = cudaGetLastError();
  return error == cudaSuccess ? nullptr : cudaGetErrorString(error);
}

// Calls `launch` with the element type's pointer type as a tag.
template <typename Launch>
const char* ForElement(Element element, Launch launch) {
  switch (element) {
    case Element::kFloat32:
      launch(static_cast<float*>(nullptr));
      break;
    case Element::kBFloat16:
      launch(static_cast<__nv_bfloat16*>(nullptr));
      break;
    case Element::kFloat16:
      launch(static_cast<__half*>(nullptr));
      break;
  }
  return LastError();
}

}  // namespace

const char* RmsNormForward(Element element, const void* x, const void* weight, void* y, float* rstd,
                           int64_t rows, int64_t cols, float eps, void* stream) {
  if (rows == 0) return nullptr;
  if (rows > kMaxRowBlocks) return kTooManyRows;
  return ForElement(element, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    RmsNormForwardKernel<T>
        <<<static_cast<unsigned>(rows), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
            static_cast<const T*>(x), static_cast<const T*>(weight), static_cast<T*>(y), rstd, cols,
            eps);
  });
}

const char* RmsNormBackward(Element element, const void* x, const void* weight, const float* rstd,
                            const void* dy, void* dx, int64_t rows, int64_t cols, void* stream) {
  if (rows == 0) return nullptr;
  if (rows > kMaxRowBlocks) return kTooManyRows;
  return ForElement(element, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    RmsNormBackwardKernel<T>
        <<<static_cast<unsigned>(rows), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
            static_cast<const T*>(x), static_cast<const T*>(weight), rstd,
            static_cast<const T*>(dy), static_cast<T*>(dx), cols);
  });
}

const char* GluForward(GluActivation activation, Element element, const void* g, const void* u,
                       void* h, int64_t n, void* stream) {
  if (n == 0) return nullptr;
  return ForElement(element, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    const auto launch = [&](auto kernel) {
      kernel<<<Blocks(n), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
          static_cast<const T*>(g), static_cast<const T*>(u), static_cast<T*>(h), n);
    };
    if (activation == GluActivation::kSilu) {
      launch(GluForwardKernel<GluActivation::kSilu, T>);
    } else {
      launch(GluForwardKernel<GluActivation::kGeluTanh, T>);
    }
  });
}

const char* GluBackward(GluActivation activation, Element element, const void* g, const void* u,
                        const void* dh, void* dg, void* du, int64_t n, void* stream) {
  if (n == 0) return nullptr;
  return ForElement(element, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    const auto launch = [&](auto kernel) {
      kernel<<<Blocks(n), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
          static_cast<const T*>(g), static_cast<const T*>(u), static_cast<const T*>(dh),
          static_cast<T*>(dg), static_cast<T*>(du), n);
    };
    if (activation == GluActivation::kSilu) {
      launch(GluBackwardKernel<GluActivation::kSilu, T>);
    } else {
      launch(GluBackwardKernel<GluActivation::kGeluTanh, T>);
    }
  });
}

const char* Rope(Element element, const void* x, const float* cos, const float* sin, void* y,
                 int64_t batch, int64_t seq, int64_t heads, int64_t dim, bool inverse,
                 void* stream) {
  const int64_t rows = batch * seq * heads;
  if (rows == 0) return nullptr;
  return ForElement(element, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    RopeKernel<T><<<Blocks(rows * (dim / 2)), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
        static_cast<const T*>(x), cos, sin, static_cast<T*>(y), rows, seq, heads, dim, inverse);
  });
}

const char* CrossEntropyGrad(Element element, void* logits, const int64_t* labels,
                             const float* scale, float* row_loss, int64_t rows, int64_t cols,
                             int64_t ignore, void* stream) {
  if (rows == 0) return nullptr;
  if (rows > kMaxRowBlocks) return kTooManyRows;
  return ForElement(element, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    CrossEntropyGradKernel<T>
        <<<static_cast<unsigned>(rows), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
            static_cast<T*>(logits), labels, scale, row_loss, cols, ignore);
  });
}

}  // namespace llmctl::kernels::cuda
