#include "trainer/train/offload.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <vector>

#include "trainer/train/optimizer.h"

namespace llmctl::trainer {
namespace {

// The host gradient buffers of MakeOffloadedAdamW's state: master weights, exp_avg, exp_avg_sq,
// then the buffers, one of each per parameter.
torch::Tensor HostGrad(const Optimizer& optimizer, size_t params, size_t index) {
  return optimizer.StateTensors()[3 * params + index];
}

// Backward through sum(param * weights): param's gradient is `weights`, in param's dtype.
void Backward(const torch::Tensor& param, const torch::Tensor& weights) {
  (param * weights).sum().backward();
}

// A 16-bit gradient is widened a block at a time into the fp32 buffer; over a size that is not a
// whole number of blocks the sum must equal widening each micro-batch's gradient whole and adding
// them in fp32, as .grad's accumulation in fp32 would.
TEST(OffloadedAdamWTest, HostBuffersAddUpSixteenBitGradientsExactly) {
  torch::manual_seed(0);
  for (const torch::ScalarType dtype : {torch::kBFloat16, torch::kHalf, torch::kFloat32}) {
    const auto options = torch::TensorOptions().dtype(dtype);
    // (3, 100,003) and a small one: 300,009 values spans two blocks and part of a third.
    std::vector<torch::Tensor> params = {torch::randn({3, 100003}, options).requires_grad_(),
                                         torch::randn({7}, options).requires_grad_()};
    OptimizerOptions adamw;
    adamw.lr = 1e-3;
    const std::unique_ptr<Optimizer> optimizer = MakeOffloadedAdamW(adamw, params);
    std::vector<torch::Tensor> expected(params.size());
    for (int micro_batch = 0; micro_batch < 3; ++micro_batch) {
      for (size_t i = 0; i < params.size(); ++i) {
        const torch::Tensor weights = torch::randn(params[i].sizes(), options);
        Backward(params[i], weights);
        EXPECT_FALSE(params[i].grad().defined()) << "the device gradient is freed by the hook";
        const torch::Tensor widened = weights.to(torch::kFloat32);
        expected[i] = micro_batch == 0 ? widened : expected[i] + widened;
      }
    }
    for (size_t i = 0; i < params.size(); ++i) {
      const torch::Tensor buffer = HostGrad(*optimizer, params.size(), i);
      EXPECT_EQ(buffer.scalar_type(), torch::kFloat32);
      EXPECT_TRUE(torch::equal(buffer, expected[i]))
          << c10::toString(dtype) << " parameter " << i << ": largest difference "
          << (buffer - expected[i]).abs().max().item<float>();
    }
  }
}

}  // namespace
}  // namespace llmctl::trainer
