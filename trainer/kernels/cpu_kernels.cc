#include "trainer/kernels/cpu_kernels.h"

#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "trainer/kernels/row_math.h"

namespace llmctl::kernels::cpu {
namespace {

// Loads and stores through fp32 as plain bit operations the compiler vectorises (c10's
// conversions round through a branch, which keeps a loop scalar): bf16 is the top half of an fp32,
// rounded to nearest even, NaN kept a NaN.
inline float Load(float v) { return v; }
inline float Load(c10::Half v) { return static_cast<float>(v); }
inline float Load(c10::BFloat16 v) {
  const uint32_t bits = static_cast<uint32_t>(v.x) << 16;
  float f;
  __builtin_memcpy(&f, &bits, sizeof(f));
  return f;
}
template <typename T>
inline T Store(float v) {
  return static_cast<T>(v);
}
template <>
inline c10::BFloat16 Store<c10::BFloat16>(float v) {
  uint32_t bits;
  __builtin_memcpy(&bits, &v, sizeof(bits));
  const uint32_t rounded = (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16;
  const bool nan = (bits & 0x7fffffffu) > 0x7f800000u;
  return c10::BFloat16(static_cast<uint16_t>(nan ? 0x7fc0u : rounded), c10::BFloat16::from_bits());
}

// Rows per task: enough work to be worth a thread's start.
int64_t RowGrain(int64_t cols) { return std::max<int64_t>(1, 32768 / std::max<int64_t>(cols, 1)); }
constexpr int64_t kElementGrain = 32768;

// Every loop below is a function of its own over restrict pointers, compiled for AVX-512, AVX2 and
// the baseline, the CPU's best picked when the library loads (GCC's target_clones): inside
// parallel_for's lambdas, or for SSE2 alone, the loops ran 8 to 20 times slower than ATen's own
// runtime-dispatched kernels. No clone reorders a sum or contracts a multiply-add
// (-ffp-contract=off, no fast-math), so every clone gives the same bits.
#define LLMCTL_VECTOR_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))

// Row sums in this many independent fp32 partial sums, which the compiler vectorises (one running
// sum could not be reordered); their error is that of a sum of cols / kLanes terms.
constexpr int64_t kLanes = 16;

inline float SumLanes(const float* lanes) {
  float total = 0.0f;
  for (int64_t l = 0; l < kLanes; ++l) total += lanes[l];
  return total;
}

template <typename T>
LLMCTL_VECTOR_CLONES void RmsNormRows(const T* __restrict x, const T* __restrict w, T* __restrict y,
                                      float* __restrict rstd, int64_t begin, int64_t end,
                                      int64_t cols, float eps) {
  for (int64_t row = begin; row < end; ++row) {
    const T* xr = x + row * cols;
    float lanes[kLanes] = {};
    int64_t j = 0;
    for (; j + kLanes <= cols; j += kLanes) {
      for (int64_t l = 0; l < kLanes; ++l) lanes[l] += Load(xr[j + l]) * Load(xr[j + l]);
    }
    for (; j < cols; ++j) lanes[0] += Load(xr[j]) * Load(xr[j]);
    const float r = RowRstd(SumLanes(lanes), cols, eps);
    rstd[row] = r;
    T* yr = y + row * cols;
    for (j = 0; j < cols; ++j) {
      // Rounded to the input's dtype before the weight scales it, as transformers does.
      yr[j] = Store<T>(Load(w[j]) * Load(Store<T>(Load(xr[j]) * r)));
    }
  }
}

template <typename T>
LLMCTL_VECTOR_CLONES void RmsNormBackwardRows(const T* __restrict x, const T* __restrict w,
                                              const float* __restrict rstd, const T* __restrict dy,
                                              T* __restrict dx, int64_t begin, int64_t end,
                                              int64_t cols) {
  for (int64_t row = begin; row < end; ++row) {
    const T* xr = x + row * cols;
    const T* gr = dy + row * cols;
    float lanes[kLanes] = {};
    int64_t j = 0;
    for (; j + kLanes <= cols; j += kLanes) {
      for (int64_t l = 0; l < kLanes; ++l) {
        lanes[l] += Load(gr[j + l]) * Load(w[j + l]) * Load(xr[j + l]);
      }
    }
    for (; j < cols; ++j) lanes[0] += Load(gr[j]) * Load(w[j]) * Load(xr[j]);
    const float dot_over_n = SumLanes(lanes) / static_cast<float>(cols);
    T* dr = dx + row * cols;
    for (j = 0; j < cols; ++j) {
      dr[j] =
          Store<T>(RmsNormInputGrad(Load(xr[j]), Load(gr[j]) * Load(w[j]), rstd[row], dot_over_n));
    }
  }
}

// Columns [begin, end) of the weight's gradient, each summed over the rows in order.
template <typename T>
LLMCTL_VECTOR_CLONES void RmsNormWeightColumns(const T* __restrict x, const float* __restrict rstd,
                                               const T* __restrict dy, float* __restrict dw,
                                               int64_t begin, int64_t end, int64_t rows,
                                               int64_t cols) {
  for (int64_t j = begin; j < end; ++j) dw[j] = 0.0f;
  for (int64_t row = 0; row < rows; ++row) {
    const T* xr = x + row * cols;
    const T* gr = dy + row * cols;
    const float r = rstd[row];
    for (int64_t j = begin; j < end; ++j) dw[j] += Load(gr[j]) * Load(Store<T>(Load(xr[j]) * r));
  }
}

// 16-bit elements are widened into fp32 blocks of this many on the stack first: the activation's
// arithmetic over 16-bit loads and stores vectorises at a quarter of its fp32 speed (measured:
// 5.3 ms against 1.5 ms staged, for 2M bf16 elements).
constexpr int64_t kStageBlock = 256;

template <GluActivation A, typename T>
LLMCTL_VECTOR_CLONES void GluRange(const T* __restrict g, const T* __restrict u, T* __restrict h,
                                   int64_t n) {
  if constexpr (std::is_same_v<T, float>) {
    for (int64_t i = 0; i < n; ++i) h[i] = Glu<A>::Forward(g[i], u[i]);
  } else {
    float gb[kStageBlock], ub[kStageBlock], hb[kStageBlock];
    for (int64_t start = 0; start < n; start += kStageBlock) {
      const int64_t m = std::min(kStageBlock, n - start);
      for (int64_t i = 0; i < m; ++i) {
        gb[i] = Load(g[start + i]);
        ub[i] = Load(u[start + i]);
      }
      for (int64_t i = 0; i < m; ++i) hb[i] = Glu<A>::Forward(gb[i], ub[i]);
      for (int64_t i = 0; i < m; ++i) h[start + i] = Store<T>(hb[i]);
    }
  }
}

template <GluActivation A, typename T>
LLMCTL_VECTOR_CLONES void GluBackwardRange(const T* __restrict g, const T* __restrict u,
                                           const T* __restrict dh, T* __restrict dg,
                                           T* __restrict du, int64_t n) {
  if constexpr (std::is_same_v<T, float>) {
    for (int64_t i = 0; i < n; ++i) Glu<A>::Backward(g[i], u[i], dh[i], &dg[i], &du[i]);
  } else {
    float gb[kStageBlock], ub[kStageBlock], hb[kStageBlock], dgb[kStageBlock], dub[kStageBlock];
    for (int64_t start = 0; start < n; start += kStageBlock) {
      const int64_t m = std::min(kStageBlock, n - start);
      for (int64_t i = 0; i < m; ++i) {
        gb[i] = Load(g[start + i]);
        ub[i] = Load(u[start + i]);
        hb[i] = Load(dh[start + i]);
      }
      for (int64_t i = 0; i < m; ++i) Glu<A>::Backward(gb[i], ub[i], hb[i], &dgb[i], &dub[i]);
      for (int64_t i = 0; i < m; ++i) {
        dg[start + i] = Store<T>(dgb[i]);
        du[start + i] = Store<T>(dub[i]);
      }
    }
  }
}

// Rows [begin, end) of (B, T, H) rows of `dim` values, row r at position (r / heads) % seq.
template <typename T>
LLMCTL_VECTOR_CLONES void RopeRows(const T* __restrict x, const float* __restrict cos,
                                   const float* __restrict sin, T* __restrict y, int64_t begin,
                                   int64_t end, int64_t seq, int64_t heads, int64_t dim,
                                   bool inverse) {
  const int64_t half = dim / 2;
  for (int64_t row = begin; row < end; ++row) {
    const int64_t t = (row / heads) % seq;
    const T* xr = x + row * dim;
    T* yr = y + row * dim;
    const float* c = cos + t * dim;
    const float* s = sin + t * dim;
    for (int64_t i = 0; i < half; ++i) {
      float a = 0.0f;
      float b = 0.0f;
      if (inverse) {
        RotateBack(Load(xr[i]), Load(xr[i + half]), c[i], s[i], &a, &b);
      } else {
        Rotate(Load(xr[i]), Load(xr[i + half]), c[i], s[i], &a, &b);
      }
      yr[i] = Store<T>(a);
      yr[i + half] = Store<T>(b);
    }
  }
}

// Rows [begin, end) of (rows, cols) logits: each row's cross-entropy against its label into
// row_loss, and in place of the logits its gradient for `scale` times the summed loss (zeros and a
// loss of 0 for a row labelled `ignore`). Three passes over a row: its maximum, its sum of
// exponentials, the gradient; a row (cols elements) stays in the core's cache between them. 16-bit
// rows go through fp32 blocks on the stack, as the gated activations do.
template <typename T>
LLMCTL_VECTOR_CLONES void CrossEntropyRows(T* __restrict logits, const int64_t* __restrict labels,
                                           float* __restrict row_loss, int64_t begin, int64_t end,
                                           int64_t cols, int64_t ignore, float scale) {
  float block[kStageBlock];
  for (int64_t row = begin; row < end; ++row) {
    T* xr = logits + row * cols;
    const int64_t target = labels[row];
    if (target == ignore) {
      row_loss[row] = 0.0f;
      for (int64_t j = 0; j < cols; ++j) xr[j] = Store<T>(0.0f);
      continue;
    }
    float maxima[kLanes];
    for (int64_t l = 0; l < kLanes; ++l) maxima[l] = -INFINITY;
    float sums[kLanes] = {};
    int64_t j = 0;
    for (; j + kLanes <= cols; j += kLanes) {
      for (int64_t l = 0; l < kLanes; ++l) {
        const float v = Load(xr[j + l]);
        maxima[l] = maxima[l] > v ? maxima[l] : v;
      }
    }
    for (; j < cols; ++j) maxima[0] = maxima[0] > Load(xr[j]) ? maxima[0] : Load(xr[j]);
    float row_max = maxima[0];
    for (int64_t l = 1; l < kLanes; ++l) row_max = row_max > maxima[l] ? row_max : maxima[l];
    for (int64_t start = 0; start < cols; start += kStageBlock) {
      const int64_t m = std::min(kStageBlock, cols - start);
      for (int64_t i = 0; i < m; ++i) block[i] = Load(xr[start + i]);
      int64_t i = 0;
      for (; i + kLanes <= m; i += kLanes) {
        for (int64_t l = 0; l < kLanes; ++l) sums[l] += Exp(block[i + l] - row_max);
      }
      for (; i < m; ++i) sums[0] += Exp(block[i] - row_max);
    }
    const float lse = RowLogSumExp(row_max, SumLanes(sums));
    const float x_target = Load(xr[target]);
    row_loss[row] = lse - x_target;
    for (int64_t start = 0; start < cols; start += kStageBlock) {
      const int64_t m = std::min(kStageBlock, cols - start);
      for (int64_t i = 0; i < m; ++i)
        block[i] = CrossEntropyLogitGrad(Load(xr[start + i]), lse, scale);
      for (int64_t i = 0; i < m; ++i) xr[start + i] = Store<T>(block[i]);
    }
    xr[target] = Store<T>(CrossEntropyTargetLogitGrad(x_target, lse, scale));
  }
}

#define LLMCTL_DISPATCH(type, name, ...) \
  AT_DISPATCH_FLOATING_TYPES_AND2(torch::kBFloat16, torch::kHalf, type, name, __VA_ARGS__)

}  // namespace

void RmsNormForward(const torch::Tensor& x, const torch::Tensor& weight, torch::Tensor& y,
                    torch::Tensor& rstd, float eps) {
  const int64_t cols = x.size(1);
  LLMCTL_DISPATCH(x.scalar_type(), "RmsNorm", [&] {
    at::parallel_for(0, x.size(0), RowGrain(cols), [&](int64_t begin, int64_t end) {
      RmsNormRows(x.data_ptr<scalar_t>(), weight.data_ptr<scalar_t>(), y.data_ptr<scalar_t>(),
                  rstd.data_ptr<float>(), begin, end, cols, eps);
    });
  });
}

void RmsNormBackward(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& rstd,
                     const torch::Tensor& dy, torch::Tensor& dx) {
  const int64_t cols = x.size(1);
  LLMCTL_DISPATCH(x.scalar_type(), "RmsNormBackward", [&] {
    at::parallel_for(0, x.size(0), RowGrain(cols), [&](int64_t begin, int64_t end) {
      RmsNormBackwardRows(x.data_ptr<scalar_t>(), weight.data_ptr<scalar_t>(),
                          rstd.data_ptr<float>(), dy.data_ptr<scalar_t>(), dx.data_ptr<scalar_t>(),
                          begin, end, cols);
    });
  });
}

void RmsNormWeightGrad(const torch::Tensor& x, const torch::Tensor& rstd, const torch::Tensor& dy,
                       torch::Tensor& dweight) {
  const int64_t rows = x.size(0);
  const int64_t cols = x.size(1);
  LLMCTL_DISPATCH(x.scalar_type(), "RmsNormWeightGrad", [&] {
    // Each task owns its columns' sums: the order is the rows' whatever the thread count.
    at::parallel_for(0, cols, 64, [&](int64_t begin, int64_t end) {
      RmsNormWeightColumns(x.data_ptr<scalar_t>(), rstd.data_ptr<float>(), dy.data_ptr<scalar_t>(),
                           dweight.data_ptr<float>(), begin, end, rows, cols);
    });
  });
}

void GluForward(GluActivation activation, const torch::Tensor& g, const torch::Tensor& u,
                torch::Tensor& h) {
  LLMCTL_DISPATCH(g.scalar_type(), "Glu", [&] {
    at::parallel_for(0, g.numel(), kElementGrain, [&](int64_t begin, int64_t end) {
      const scalar_t* gp = g.data_ptr<scalar_t>() + begin;
      const scalar_t* up = u.data_ptr<scalar_t>() + begin;
      scalar_t* hp = h.data_ptr<scalar_t>() + begin;
      if (activation == GluActivation::kSilu) {
        GluRange<GluActivation::kSilu>(gp, up, hp, end - begin);
      } else {
        GluRange<GluActivation::kGeluTanh>(gp, up, hp, end - begin);
      }
    });
  });
}

void GluBackward(GluActivation activation, const torch::Tensor& g, const torch::Tensor& u,
                 const torch::Tensor& dh, torch::Tensor& dg, torch::Tensor& du) {
  LLMCTL_DISPATCH(g.scalar_type(), "GluBackward", [&] {
    at::parallel_for(0, g.numel(), kElementGrain, [&](int64_t begin, int64_t end) {
      const scalar_t* gp = g.data_ptr<scalar_t>() + begin;
      const scalar_t* up = u.data_ptr<scalar_t>() + begin;
      const scalar_t* dhp = dh.data_ptr<scalar_t>() + begin;
      scalar_t* dgp = dg.data_ptr<scalar_t>() + begin;
      scalar_t* dup = du.data_ptr<scalar_t>() + begin;
      if (activation == GluActivation::kSilu) {
        GluBackwardRange<GluActivation::kSilu>(gp, up, dhp, dgp, dup, end - begin);
      } else {
        GluBackwardRange<GluActivation::kGeluTanh>(gp, up, dhp, dgp, dup, end - begin);
      }
    });
  });
}

void Rope(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin,
          torch::Tensor& y, bool inverse) {
  const int64_t dim = x.size(3);
  LLMCTL_DISPATCH(x.scalar_type(), "Rope", [&] {
    at::parallel_for(0, x.numel() / dim, RowGrain(dim), [&](int64_t begin, int64_t end) {
      RopeRows(x.data_ptr<scalar_t>(), cos.data_ptr<float>(), sin.data_ptr<float>(),
               y.data_ptr<scalar_t>(), begin, end, x.size(1), x.size(2), dim, inverse);
    });
  });
}

void CrossEntropyGrad(torch::Tensor& logits, const torch::Tensor& labels, float scale,
                      int64_t ignore, torch::Tensor& row_loss) {
  const int64_t cols = logits.size(1);
  LLMCTL_DISPATCH(logits.scalar_type(), "CrossEntropyGrad", [&] {
    at::parallel_for(0, logits.size(0), 1, [&](int64_t begin, int64_t end) {
      CrossEntropyRows(logits.data_ptr<scalar_t>(), labels.data_ptr<int64_t>(),
                       row_loss.data_ptr<float>(), begin, end, cols, ignore, scale);
    });
  });
}

}  // namespace llmctl::kernels::cpu
