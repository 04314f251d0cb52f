#include "trainer/testing/adam_step_bound.h"

#include <gtest/gtest.h>

#include <cmath>
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

double AdamWDirectionBound(int64_t step, double beta1, double beta2) {
  // m-hat = sum_s a_s g_s and v-hat = sum_s b_s g_s^2, each weighting summing to 1; by
  // Cauchy-Schwarz |m-hat| <= sqrt(sum_s a_s^2 / b_s) * sqrt(v-hat).
  const double m_norm = 1 - std::pow(beta1, static_cast<double>(step));
  const double v_norm = 1 - std::pow(beta2, static_cast<double>(step));
  double sum = 0;
  for (int64_t age = 0; age < step; ++age) {
    const double a = (1 - beta1) * std::pow(beta1, static_cast<double>(age)) / m_norm;
    const double b = (1 - beta2) * std::pow(beta2, static_cast<double>(age)) / v_norm;
    sum += a * a / b;
  }
  return std::sqrt(sum);
}

torch::Tensor AdamWGradient(const AdamWMoments& moments, int64_t step, double beta1) {
  const torch::Tensor m = moments.exp_avg.at(step - 1).to(torch::kFloat64);
  if (step == 1) return m / (1 - beta1);
  return (m - beta1 * moments.exp_avg.at(step - 2).to(torch::kFloat64)) / (1 - beta1);
}

std::vector<torch::Tensor> AdamWCrossOrderBounds(const AdamWMoments& moments,
                                                 const AdamWMoments& sampled,
                                                 const AdamWSteps& steps) {
  std::vector<torch::Tensor> bounds;
  EXPECT_EQ(moments.exp_avg.size(), steps.lr.size());
  EXPECT_EQ(sampled.exp_avg.size(), steps.lr.size());
  torch::Tensor bound = torch::zeros_like(moments.exp_avg.at(0), torch::kFloat64);
  for (size_t i = 0;
       i < steps.lr.size() && i < moments.exp_avg.size() && i < sampled.exp_avg.size(); ++i) {
    const auto t = static_cast<double>(i + 1);
    const double m_norm = 1 - std::pow(steps.beta1, t);
    const double v_norm = 1 - std::pow(steps.beta2, t);
    auto m_hat = [&](const AdamWMoments& run) {
      return run.exp_avg[i].to(torch::kFloat64) / m_norm;
    };
    auto root_v_hat = [&](const AdamWMoments& run) {
      return (run.exp_avg_sq[i].to(torch::kFloat64) / v_norm).sqrt();
    };
    const double m_spread =
        kRoundingMargin * (m_hat(moments) - m_hat(sampled)).abs().max().item<double>();
    const double v_spread =
        kRoundingMargin * (root_v_hat(moments) - root_v_hat(sampled)).abs().max().item<double>();
    const double direction =
        AdamWDirectionBound(static_cast<int64_t>(i + 1), steps.beta1, steps.beta2);
    const torch::Tensor direction_spread =
        ((m_spread + direction * v_spread) / (root_v_hat(moments) + steps.eps))
            .clamp_max(2 * direction);
    bound = (1 - steps.lr[i] * steps.weight_decay) * bound + steps.lr[i] * direction_spread;
    bounds.push_back(bound);
  }
  return bounds;
}

}  // namespace llmctl::trainer::testing
