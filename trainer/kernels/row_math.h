// The per-element and per-row arithmetic of the fused kernels (fused_ops.h), shared by the CPU
// loops (cpu_kernels.cc) and the CUDA kernels (cuda_kernels.cu), so that the CPU tests exercise
// the arithmetic the GPU runs. Everything is fp32, whatever the tensors' dtype: the kernels load
// an element, widen it, compute here and round once when they store.
#ifndef LLMCTL_TRAINER_KERNELS_ROW_MATH_H_
#define LLMCTL_TRAINER_KERNELS_ROW_MATH_H_

#include <math.h>

#if defined(__CUDACC__)
#define LLMCTL_HOST_DEVICE __host__ __device__
#else
#define LLMCTL_HOST_DEVICE
#endif

namespace llmctl::kernels {

// e^x within about 2 ulp for x in [-87, 88] (Cephes' expf: e^x = 2^k e^r with k = round(x / ln 2)
// and |r| <= ln 2 / 2, e^r by its degree-7 polynomial), clamped beyond. Branch-free and without a
// library call, so that the CPU loops over it vectorise (a call to expf keeps them scalar, four to
// eight times slower), and the same arithmetic on the GPU.
LLMCTL_HOST_DEVICE inline float Exp(float x) {
  // Comparisons, not fminf/fmaxf: those are library calls (NaN rules) that keep a loop scalar. A
  // NaN stays NaN.
  x = x < -87.0f ? -87.0f : (x > 88.0f ? 88.0f : x);
  // Round to nearest by adding and subtracting 1.5 * 2^23 (exact for |x / ln 2| < 2^22).
  const float k = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  const float r = (x - k * 0.693359375f) - k * -2.12194440e-4f;  // Cody-Waite: ln 2 in two parts
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float er = p * r * r + r + 1.0f;
  // 2^k from k's bits in the exponent field (k + 127 in 1 .. 254 after the clamp).
  const int bits = (static_cast<int>(k) + 127) << 23;
  float two_k;
#if defined(__CUDA_ARCH__)
  two_k = __int_as_float(bits);
#else
  __builtin_memcpy(&two_k, &bits, sizeof(two_k));
#endif
  return er * two_k;
}

// The gated activations of a gated MLP, act(g) * u: LLaMA's SwiGLU (silu) and T5's gated-GELU
// (gelu_new, the tanh approximation).
enum class GluActivation { kSilu, kGeluTanh };

// SwiGLU's activation of one element: silu(g) * u, silu(g) = g / (1 + e^-g) as ATen computes it.
LLMCTL_HOST_DEVICE inline float SwiGlu(float g, float u) { return g / (1.0f + Exp(-g)) * u; }

// Its gradients from the output's gradient `dh`, recomputing the activation from g and u (the
// only tensors the op keeps): d/du = silu(g); d/dg = u sigmoid(g) (1 + g (1 - sigmoid(g))).
LLMCTL_HOST_DEVICE inline void SwiGluBackward(float g, float u, float dh, float* dg, float* du) {
  const float sigmoid = 1.0f / (1.0f + Exp(-g));
  *du = dh * (g * sigmoid);
  *dg = dh * u * (sigmoid * (1.0f + g * (1.0f - sigmoid)));
}

// gelu_new's argument scale, sqrt(2 / pi), and twice it: 0.5 (1 + tanh(z)) = sigmoid(2 z), so
// gelu_new(g) = g sigmoid(2 z) with z = sqrt(2 / pi) (g + 0.044715 g^3), the same form as silu and
// without tanh's cancellation near 0.
constexpr float kGeluTanhScale = 0.7978845608028654f;
constexpr float kGeluTanhCubic = 0.044715f;

// T5's gated-GELU of one element: gelu_new(g) * u.
LLMCTL_HOST_DEVICE inline float GeGlu(float g, float u) {
  const float z2 = 2.0f * kGeluTanhScale * (g + kGeluTanhCubic * g * g * g);
  return g / (1.0f + Exp(-z2)) * u;
}

// Its gradients, recomputing the activation: with s = sigmoid(2 z), d/du = g s;
// d/dg = u (s + g s (1 - s) 2 z'), z' = sqrt(2 / pi) (1 + 3 * 0.044715 g^2).
LLMCTL_HOST_DEVICE inline void GeGluBackward(float g, float u, float dh, float* dg, float* du) {
  const float z2 = 2.0f * kGeluTanhScale * (g + kGeluTanhCubic * g * g * g);
  const float s = 1.0f / (1.0f + Exp(-z2));
  const float dz2 = 2.0f * kGeluTanhScale * (1.0f + 3.0f * kGeluTanhCubic * g * g);
  *du = dh * (g * s);
  *dg = dh * u * (s + g * s * (1.0f - s) * dz2);
}

// The activation as a type, for the loops and kernels templated over it (a branch per element
// would keep them from vectorising).
template <GluActivation A>
struct Glu;
template <>
struct Glu<GluActivation::kSilu> {
  LLMCTL_HOST_DEVICE static float Forward(float g, float u) { return SwiGlu(g, u); }
  LLMCTL_HOST_DEVICE static void Backward(float g, float u, float dh, float* dg, float* du) {
    SwiGluBackward(g, u, dh, dg, du);
  }
};
template <>
struct Glu<GluActivation::kGeluTanh> {
  LLMCTL_HOST_DEVICE static float Forward(float g, float u) { return GeGlu(g, u); }
  LLMCTL_HOST_DEVICE static void Backward(float g, float u, float dh, float* dg, float* du) {
    GeGluBackward(g, u, dh, dg, du);
  }
};

// Rotary embedding of one pair of a head: x1 at index i < D/2 and x2 at i + D/2, whose angle's
// cosine and sine both halves share (transformers' x cos + rotate_half(x) sin).
LLMCTL_HOST_DEVICE inline void Rotate(float x1, float x2, float c, float s, float* y1, float* y2) {
  *y1 = x1 * c - x2 * s;
  *y2 = x2 * c + x1 * s;
}

// Its backward: the inverse rotation of the output's gradient, which needs nothing but the angle.
LLMCTL_HOST_DEVICE inline void RotateBack(float dy1, float dy2, float c, float s, float* dx1,
                                          float* dx2) {
  *dx1 = dy1 * c + dy2 * s;
  *dx2 = dy2 * c - dy1 * s;
}

// RMSNorm's reciprocal root mean square of a row of n values whose squares sum to `sum_squares`:
// 1 / sqrt(mean + eps), the mean and the sum rounded as transformers' fp32 ops round them.
LLMCTL_HOST_DEVICE inline float RowRstd(float sum_squares, long long n, float eps) {
  return 1.0f / sqrtf(sum_squares / static_cast<float>(n) + eps);
}

// The gradient of a row's input element x from dn = dy * weight (the normalised value's gradient)
// and `dot_over_n`, the row's sum of dn * x over n: with n = x r, r = (mean(x^2) + eps)^-1/2,
//   dx = r dn - r^3 x (sum dn x) / n.
LLMCTL_HOST_DEVICE inline float RmsNormInputGrad(float x, float dn, float rstd, float dot_over_n) {
  return rstd * dn - rstd * rstd * rstd * x * dot_over_n;
}

// The cross-entropy of a row of logits x against its label t, with lse = log sum_j e^x_j formed
// as max + log(sum_j e^(x_j - max)): the loss lse - x_t, and the gradient of `scale` times it,
// scale (softmax(x)_j - [j = t]), per element. The row's maximum keeps every exponent <= 0.
LLMCTL_HOST_DEVICE inline float RowLogSumExp(float row_max, float sum_exp) {
  return row_max + logf(sum_exp);
}
LLMCTL_HOST_DEVICE inline float CrossEntropyLogitGrad(float x, float lse, float scale) {
  return Exp(x - lse) * scale;  // j != t
}
LLMCTL_HOST_DEVICE inline float CrossEntropyTargetLogitGrad(float x, float lse, float scale) {
  return (Exp(x - lse) - 1.0f) * scale;  // j = t
}

}  // namespace llmctl::kernels

#endif  // LLMCTL_TRAINER_KERNELS_ROW_MATH_H_
