// Test support: how far the loss after one Adam(W) step may honestly differ from a fixture written
// on another CPU.
//
// Adam's first step moves each parameter by lr * g / (|g| + eps), which is lr * sign(g) wherever
// |g| >> eps. A gradient that is zero up to rounding takes whichever sign the CPU's reduction order
// gives it (AVX2, AVX-512 and AMX matmuls sum in different orders), so on another machine that
// parameter moves by up to 2 * lr the other way. The loss after the step then differs, to first
// order, by 2 * lr * |dL/dtheta| at the stepped point for each such parameter: far more than the
// float32 rounding of the loss itself. The bound below sums exactly that over the parameters whose
// sign is in doubt.
//
// Which signs are in doubt comes from the arithmetic, not from the last machine: the same gradients
// computed in float64 give this machine's float32 rounding error of each tensor's gradient. Another
// reduction order has the same worst-case error bound (gamma_K * sum |terms|) that this error
// samples; kRoundingMargin times the tensor's largest measured error covers it with room. A
// gradient whose float64 value is within that of zero may have either sign elsewhere.
#ifndef LLMCTL_TRAINER_TESTING_ADAM_STEP_BOUND_H_
#define LLMCTL_TRAINER_TESTING_ADAM_STEP_BOUND_H_

#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <vector>

namespace llmctl::trainer::testing {

// How many times this machine's largest float32 gradient error (per tensor) another CPU's reduction
// order may reach. Summation error bounds grow with the number of terms summed in sequence; blocked
// and pairwise sums (what vectorised kernels do) stay within a small multiple of one another.
inline constexpr double kRoundingMargin = 64.0;

struct AdamFirstStepBound {
  double loss_bound = 0;      // |loss after the step here - loss after it elsewhere| <= this
  int64_t sign_in_doubt = 0;  // parameters whose first-step direction another CPU may reverse
  int64_t parameters = 0;
};

struct AdamWFirstStep {
  double loss_after = 0;
  AdamFirstStepBound bound;
};

// Takes torch's AdamW step (`lr`, `weight_decay`) on `parameters`, whose float32 gradients the
// caller's backward has just set, then evaluates `loss` at the stepped point and its gradients for
// the bound. `grads64`: the same gradients in float64 (same inputs and order).
AdamWFirstStep TakeAdamWFirstStep(const std::vector<torch::Tensor>& parameters,
                                  const std::vector<torch::Tensor>& grads64, double lr,
                                  double weight_decay, const std::function<torch::Tensor()>& loss);

// Expects the loss after the step here (`after`) within `bound` of the fixture's (`want_after`),
// the bound under a tenth of what the step moved the loss (a wider one would prove nothing), and
// the step to lower the loss; prints both sides. `before` is the loss before the step here.
void ExpectLossAfterFirstStep(double before, double want_before, double after, double want_after,
                              const AdamFirstStepBound& bound);

// Every parameter's gradient, copied (parameters without one get zeros).
std::vector<torch::Tensor> GradientsOf(const std::vector<torch::Tensor>& parameters);

}  // namespace llmctl::trainer::testing

#endif  // LLMCTL_TRAINER_TESTING_ADAM_STEP_BOUND_H_
