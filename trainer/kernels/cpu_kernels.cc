#include "trainer/kernels/cpu_kernels.h"

#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>

#include "trainer/kernels/row_math.h"

namespace llmctl::kernels::cpu {
namespace {

// Rows per task: enough work to be worth a thread's start.
int64_t RowGrain(int64_t cols) { return std::max<int64_t>(1, 32768 / std::max<int64_t>(cols, 1)); }
constexpr int64_t kElementGrain = 32768;

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
        // The sum in double, rounded once: within an ulp of the exact sum whatever the order.
        double squares = 0.0;
        for (int64_t j = 0; j < cols; ++j) {
          const float v = static_cast<float>(xr[j]);
          squares += static_cast<double>(v) * v;
        }
        const float rr = RowRstd(static_cast<float>(squares), cols, eps);
        r[row] = rr;
        scalar_t* yr = out + row * cols;
        for (int64_t j = 0; j < cols; ++j) {
          // Rounded to the input's dtype before the weight scales it, as transformers does.
          const scalar_t normed = static_cast<scalar_t>(static_cast<float>(xr[j]) * rr);
          yr[j] = static_cast<scalar_t>(static_cast<float>(w[j]) * static_cast<float>(normed));
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
            double dot = 0.0;
            for (int64_t j = 0; j < cols; ++j) {
              dot += static_cast<double>(static_cast<float>(gr[j]) * static_cast<float>(w[j])) *
                     static_cast<float>(xr[j]);
            }
            const float dot_over_n = static_cast<float>(dot / static_cast<double>(cols));
            scalar_t* dr = out + row * cols;
            for (int64_t j = 0; j < cols; ++j) {
              const float dn = static_cast<float>(gr[j]) * static_cast<float>(w[j]);
              dr[j] = static_cast<scalar_t>(
                  RmsNormInputGrad(static_cast<float>(xr[j]), dn, r[row], dot_over_n));
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
        hp[i] = static_cast<scalar_t>(SwiGlu(static_cast<float>(gp[i]), static_cast<float>(up[i])));
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
            kernels::SwiGluBackward(static_cast<float>(gp[i]), static_cast<float>(up[i]),
                                    static_cast<float>(hp[i]), &grad_g, &grad_u);
            dgp[i] = static_cast<scalar_t>(grad_g);
            dup[i] = static_cast<scalar_t>(grad_u);
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
          const float x1 = static_cast<float>(xr[i]);
          const float x2 = static_cast<float>(xr[i + half]);
          if (inverse) {
            RotateBack(x1, x2, c[t * dim + i], s[t * dim + i], &a, &b);
          } else {
            Rotate(x1, x2, c[t * dim + i], s[t * dim + i], &a, &b);
          }
          yr[i] = static_cast<scalar_t>(a);
          yr[i + half] = static_cast<scalar_t>(b);
        }
      }
    });
  });
}

}  // namespace llmctl::kernels::cpu
