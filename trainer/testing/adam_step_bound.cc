#include "trainer/testing/adam_step_bound.h"

#include <gtest/gtest.h>

#include <cstdio>

namespace llmctl::trainer::testing {
namespace {

// `grads32`: the float32 gradients the step used; `grads64`: the same parameters' gradients in
// float64; `grads_after`: the float32 gradients at the stepped point; `lr`: the step's learning
// rate. `loss_rounding` is added for the float32 rounding of the loss.
AdamFirstStepBound BoundAdamFirstStep(const std::vector<torch::Tensor>& grads32,
                                      const std::vector<torch::Tensor>& grads64,
                                      const std::vector<torch::Tensor>& grads_after, double lr,
                                      double loss_rounding) {
  AdamFirstStepBound bound;
  bound.loss_bound = loss_rounding;
  EXPECT_EQ(grads32.size(), grads64.size());
  EXPECT_EQ(grads32.size(), grads_after.size());
  for (size_t i = 0; i < grads32.size() && i < grads64.size() && i < grads_after.size(); ++i) {
    const torch::Tensor g64 = grads64[i].to(torch::kFloat64);
    const double error = (grads32[i].to(torch::kFloat64) - g64).abs().max().item<double>();
    const torch::Tensor in_doubt = g64.abs() <= kRoundingMargin * error;
    bound.sign_in_doubt += in_doubt.sum().item<int64_t>();
    bound.parameters += g64.numel();
    // Reversing a parameter's step moves it by 2 * lr; the loss moves by that times its gradient.
    bound.loss_bound +=
        2 * lr *
        grads_after[i].to(torch::kFloat64).abs().masked_select(in_doubt).sum().item<double>();
  }
  return bound;
}

}  // namespace

AdamWFirstStep TakeAdamWFirstStep(const std::vector<torch::Tensor>& parameters,
                                  const std::vector<torch::Tensor>& grads64, double lr,
                                  double weight_decay, const std::function<torch::Tensor()>& loss) {
  const std::vector<torch::Tensor> grads32 = GradientsOf(parameters);
  torch::optim::AdamW optimizer(parameters,
                                torch::optim::AdamWOptions(lr).weight_decay(weight_decay));
  optimizer.step();
  optimizer.zero_grad();
  const torch::Tensor after = loss();
  after.backward();
  return {after.item<double>(), BoundAdamFirstStep(grads32, grads64, GradientsOf(parameters), lr,
                                                   /*loss_rounding=*/1e-5)};
}

void ExpectLossAfterFirstStep(double before, double want_before, double after, double want_after,
                              const AdamFirstStepBound& bound) {
  EXPECT_NEAR(after, want_after, bound.loss_bound);
  EXPECT_LT(bound.loss_bound, 0.1 * (before - want_after));
  EXPECT_LT(after, before);
  std::printf(
      "loss %.7f (fixture %.7f), after one AdamW step %.7f (fixture %.7f, bound %.2e: %lld of %lld "
      "gradients zero up to rounding)\n",
      before, want_before, after, want_after, bound.loss_bound,
      static_cast<long long>(bound.sign_in_doubt), static_cast<long long>(bound.parameters));
}

std::vector<torch::Tensor> GradientsOf(const std::vector<torch::Tensor>& parameters) {
  std::vector<torch::Tensor> grads;
  grads.reserve(parameters.size());
  for (const torch::Tensor& p : parameters) {
    grads.push_back(p.grad().defined() ? p.grad().detach().clone() : torch::zeros_like(p));
  }
  return grads;
}

}  // namespace llmctl::trainer::testing
