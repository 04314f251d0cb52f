#include "trainer/kernels/cpu_kernels.h"

#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>

#include <cstdint>

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

// Row sums in this many independent fp32 partial sums, which the compiler vectorises (one running
// sum could not be reordered); their error is that of a sum of cols / kLanes terms.
constexpr int64_t kLanes = 16;

float SumLanes(const float* lanes) {
  float total = 0.0f;
  for (int64_t l = 0; l < kLanes; ++l) total += lanes[l];
  return total;
}

// sum_j a[j] b[j] over n elements, in fp32.
template <typename T>
float SumOfProducts(const T* a, const T* b, int64_t n) {
  float lanes[kLanes] = {};
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes) {
    for (int64_t l = 0; l < kLanes; ++l) {
      lanes[l] += Load(a[j + l]) * Load(b[j + l]);
    }
  }
  for (; j < n; ++j) lanes[0] += Load(a[j]) * Load(b[j]);
  return SumLanes(lanes);
}

// sum_j (a[j] b[j]) c[j] over n elements, in fp32.
template <typename T>
float SumOfProducts3(const T* a, const T* b, const T* c, int64_t n) {
  float lanes[kLanes] = {};
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes) {
    for (int64_t l = 0; l < kLanes; ++l) {
      lanes[l] += Load(a[j + l]) * Load(b[j + l]) * Load(c[j + l]);
    }
  }
  for (; j < n; ++j) {
    lanes[0] += Load(a[j]) * Load(b[j]) * Load(c[j]);
  }
  return SumLanes(lanes);
}

}  // namespace

void RmsNormForward(const torch::Tensor& x, const torch::Tensor& weight, torch::Tensor& y,
                    torch::Tensor& rstd, float eps) {
  const int64_t rows = x.size(0);
  const int64_t cols = x.size(1);
  float* r = rstd.data_ptr<float>();
  AT_DISPATCH_FLOATING_TYPES_AND2(torch::kBFloat16, torch::kHalf, x.scalar_type(), "RmsNorm", [&] {
    const scalar_t* in = x.data_ptr<scalar_t>();
    const scalar_t* w = weight.data_ptr<scalar_t>();
    scalar_t* out = y.data_ptr<scalar_t>();
    at::parallel_for(0, rows, RowGrain(cols), [&](int64_t begin, int64_t end) {
      for (int64_t row = begin; row < end; ++row) {
        const scalar_t* xr = in + row * cols;
        const float rr = RowRstd(SumOfProducts(xr, xr, cols), cols, eps);
        r[row] = rr;
        scalar_t* yr = out + row * cols;
        for (int64_t j = 0; j < cols; ++j) {
          // Rounded to the input's dtype before the weight scales it, as transformers does.
          const scalar_t normed = Store<scalar_t>(Load(xr[j]) * rr);
          yr[j] = Store<scalar_t>(Load(w[j]) * Load(normed));
        }
      }
    });
  });
}

void RmsNormBackward(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& rstd,
                     const torch::Tensor& dy, torch::Tensor& dx) {
  const int64_t rows = x.size(0);
  const int64_t cols = x.size(1);
  const float* r = rstd.data_ptr<float>();
  AT_DISPATCH_FLOATING_TYPES_AND2(
      torch::kBFloat16, torch::kHalf, x.scalar_type(), "RmsNormBack", [&] {
        const scalar_t* in = x.data_ptr<scalar_t>();
        const scalar_t* w = weight.data_ptr<scalar_t>();
        const scalar_t* grad = dy.data_ptr<scalar_t>();
        scalar_t* out = dx.data_ptr<scalar_t>();
        at::parallel_for(0, rows, RowGrain(cols), [&](int64_t begin, int64_t end) {
          for (int64_t row = begin; row < end; ++row) {
            const scalar_t* xr = in + row * cols;
            const scalar_t* gr = grad + row * cols;
            const float dot_over_n = SumOfProducts3(gr, w, xr, cols) / static_cast<float>(cols);
            scalar_t* dr = out + row * cols;
            for (int64_t j = 0; j < cols; ++j) {
              const float dn = Load(gr[j]) * Load(w[j]);
              dr[j] = Store<scalar_t>(RmsNormInputGrad(Load(xr[j]), dn, r[row], dot_over_n));
            }
          }
        });
      });
}

void RmsNormWeightGrad(const torch::Tensor& x, const torch::Tensor& rstd, const torch::Tensor& dy,
                       torch::Tensor& dweight) {
  const int64_t rows = x.size(0);
  const int64_t cols = x.size(1);
  const float* r = rstd.data_ptr<float>();
  float* dw = dweight.data_ptr<float>();
  AT_DISPATCH_FLOATING_TYPES_AND2(
      torch::kBFloat16, torch::kHalf, x.scalar_type(), "RmsNormWeight", [&] {
        const scalar_t* in = x.data_ptr<scalar_t>();
        const scalar_t* grad = dy.data_ptr<scalar_t>();
        // Columns per task: each task owns its columns' sums, so the order is the rows' whatever
        // the thread count.
        at::parallel_for(0, cols, 256, [&](int64_t begin, int64_t end) {
          for (int64_t j = begin; j < end; ++j) dw[j] = 0.0f;
          for (int64_t row = 0; row < rows; ++row) {
            const scalar_t* xr = in + row * cols;
            const scalar_t* gr = grad + row * cols;
            const float rr = r[row];
            for (int64_t j = begin; j < end; ++j) {
              dw[j] += Load(gr[j]) * Load(Store<scalar_t>(Load(xr[j]) * rr));
            }
          }
        });
      });
}

void SwiGluForward(const torch::Tensor& g, const torch::Tensor& u, torch::Tensor& h) {
  AT_DISPATCH_FLOATING_TYPES_AND2(torch::kBFloat16, torch::kHalf, g.scalar_type(), "SwiGlu", [&] {
    const scalar_t* gp = g.data_ptr<scalar_t>();
    const scalar_t* up = u.data_ptr<scalar_t>();
    scalar_t* hp = h.data_ptr<scalar_t>();
    at::parallel_for(0, g.numel(), kElementGrain, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        hp[i] = Store<scalar_t>(SwiGlu(Load(gp[i]), Load(up[i])));
      }
    });
  });
}

void SwiGluBackward(const torch::Tensor& g, const torch::Tensor& u, const torch::Tensor& dh,
                    torch::Tensor& dg, torch::Tensor& du) {
  AT_DISPATCH_FLOATING_TYPES_AND2(
      torch::kBFloat16, torch::kHalf, g.scalar_type(), "SwiGluBack", [&] {
        const scalar_t* gp = g.data_ptr<scalar_t>();
        const scalar_t* up = u.data_ptr<scalar_t>();
        const scalar_t* hp = dh.data_ptr<scalar_t>();
        scalar_t* dgp = dg.data_ptr<scalar_t>();
        scalar_t* dup = du.data_ptr<scalar_t>();
        at::parallel_for(0, g.numel(), kElementGrain, [&](int64_t begin, int64_t end) {
          for (int64_t i = begin; i < end; ++i) {
            float grad_g = 0.0f;
            float grad_u = 0.0f;
            kernels::SwiGluBackward(Load(gp[i]), Load(up[i]), Load(hp[i]), &grad_g, &grad_u);
            dgp[i] = Store<scalar_t>(grad_g);
            dup[i] = Store<scalar_t>(grad_u);
          }
        });
      });
}

void Rope(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin,
          torch::Tensor& y, bool inverse) {
  const int64_t seq = x.size(1);
  const int64_t heads = x.size(2);
  const int64_t dim = x.size(3);
  const int64_t half = dim / 2;
  const int64_t rows = x.numel() / dim;
  const float* c = cos.data_ptr<float>();
  const float* s = sin.data_ptr<float>();
  AT_DISPATCH_FLOATING_TYPES_AND2(torch::kBFloat16, torch::kHalf, x.scalar_type(), "Rope", [&] {
    const scalar_t* in = x.data_ptr<scalar_t>();
    scalar_t* out = y.data_ptr<scalar_t>();
    at::parallel_for(0, rows, RowGrain(dim), [&](int64_t begin, int64_t end) {
      for (int64_t row = begin; row < end; ++row) {
        const int64_t t = (row / heads) % seq;
        const scalar_t* xr = in + row * dim;
        scalar_t* yr = out + row * dim;
        for (int64_t i = 0; i < half; ++i) {
          float a = 0.0f;
          float b = 0.0f;
          const float x1 = Load(xr[i]);
          const float x2 = Load(xr[i + half]);
          if (inverse) {
            RotateBack(x1, x2, c[t * dim + i], s[t * dim + i], &a, &b);
          } else {
            Rotate(x1, x2, c[t * dim + i], s[t * dim + i], &a, &b);
          }
          yr[i] = Store<scalar_t>(a);
          yr[i + half] = Store<scalar_t>(b);
        }
      }
    });
  });
}

}  // namespace llmctl::kernels::cpu
