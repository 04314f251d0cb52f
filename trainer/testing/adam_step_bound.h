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

// --- The same steps summed in two orders on one machine -----------------------------------------
//
// Two runs that take the same AdamW steps on the same examples but sum the gradients in another
// order (2 ranks that each sum half the batch and then average, against one process that sums the
// whole batch) end with weights that differ by an amount the arithmetic bounds per element:
//
// - The gradients. Each order's float32 sum of n terms lies within gamma_n * sum |terms| of the
//   exact one, so the two orders' gradients differ by up to twice that per element; from the
//   second step on they also differ by what the weights' difference does to them. Neither sum of
//   |terms| nor the weights' effect is in a checkpoint, so, as for the first step above, a third
//   run on this machine samples both: the same steps with the other order's split (half the
//   micro-batch, accumulated twice), whose moments differ from this run's by this machine's
//   error. kRoundingMargin times each tensor's largest difference in m-hat and in sqrt(v-hat)
//   (M_t and V_t) bounds another order's on any CPU.
// - AdamW's direction. It moves each element by lr_t * u_t with u_t = m-hat / (sqrt(v-hat) + eps):
//   m-hat is a weighted mean of the gradients so far and sqrt(v-hat) a weighted root mean square,
//   so each moves by at most the gradients' largest difference, and
//       |u_t - u_t'| <= (M_t + R_t * V_t) / (sqrt(v-hat_t) + eps),
//   where R_t bounds |u_t| (Cauchy-Schwarz over the two weightings: 1 at the first step). This is
//   the amplification: where an element's gradients are near zero, sqrt(v-hat) is small and a
//   rounding-sized difference becomes a large one in the direction. It never exceeds 2 * R_t, the
//   direction reversed outright (the first-step bound's "sign in doubt").
// - The weights. Decoupled decay scales both by (1 - lr_t * weight_decay), so the difference after
//   step t is at most (1 - lr_t * weight_decay) times the one before plus lr_t times the above.
//
// Where an element's gradients are large, the bound is far below one step; where they are zero up
// to rounding, it is the steps themselves.

// AdamW's settings and the learning rate of each step taken, in order.
struct AdamWSteps {
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0;
  std::vector<double> lr;
};

// One tensor's AdamW moments after each step 1..T (index t - 1), as checkpoints hold them.
struct AdamWMoments {
  std::vector<torch::Tensor> exp_avg;
  std::vector<torch::Tensor> exp_avg_sq;
};

// R_t: the most |m-hat / sqrt(v-hat)| can be after `step` steps (1-based), whatever the gradients.
double AdamWDirectionBound(int64_t step, double beta1, double beta2);

// The gradient step `step` (1-based) fed into the moments, recovered from the first moments in
// float64 (exact up to their float32 rounding).
torch::Tensor AdamWGradient(const AdamWMoments& moments, int64_t step, double beta1);

// Per element, in float64, after each step (index t - 1): how far the weights of a run with
// `moments` may lie from those of a run of the same steps summed in another order, on any CPU.
// `sampled`: the same tensor's moments in a run of another order on this machine (above).
std::vector<torch::Tensor> AdamWCrossOrderBounds(const AdamWMoments& moments,
                                                 const AdamWMoments& sampled,
                                                 const AdamWSteps& steps);

}  // namespace llmctl::trainer::testing

#endif  // LLMCTL_TRAINER_TESTING_ADAM_STEP_BOUND_H_
