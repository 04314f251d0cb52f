// ChunkedCausalLmLoss against CausalLmLoss over the full logits: the same loss and gradients.
#include "trainer/model/loss.h"

#include <gtest/gtest.h>

#include "trainer/model/llama.h"
#include "trainer/train/optimizer.h"
#include "trainer/train/precision.h"

namespace llmctl::trainer {
namespace {

// B = 3, T = 37, C = 16, V = 101: 111 tokens, so most chunk sizes leave a short last chunk.
constexpr int64_t kBatch = 3, kSeq = 37, kHidden = 16, kVocab = 101;

struct Result {
  torch::Tensor loss, grad_hidden, grad_weight;
};

// Largest absolute difference relative to the largest magnitude of `expected`.
double RelativeError(const torch::Tensor& actual, const torch::Tensor& expected) {
  const torch::Tensor a = actual.to(torch::kFloat64), e = expected.to(torch::kFloat64);
  return ((a - e).abs().max() / e.abs().max()).item<double>();
}

// Loss and gradients of hidden (B, T, C) and the output weight (V, C), with about a third of the
// labels -100; chunk_tokens 0 means the full logits. `plain_head` passes the weight as the plain
// head's, `loss_scale` multiplies the loss before backward (as gradient accumulation does).
Result LossAndGradients(torch::Dtype dtype, int64_t chunk_tokens, bool autocast,
                        bool plain_head = false, double loss_scale = 1.0) {
  torch::manual_seed(0);
  torch::Tensor hidden = torch::randn({kBatch, kSeq, kHidden}).to(dtype).requires_grad_(true);
  torch::Tensor weight = (0.5 * torch::randn({kVocab, kHidden})).to(dtype).requires_grad_(true);
  torch::Tensor labels = torch::randint(0, kVocab, {kBatch, kSeq}, torch::kInt64);
  labels.masked_fill_(torch::rand({kBatch, kSeq}) < 0.3, -100);
  auto logits_of = [weight](const torch::Tensor& h) {
    return torch::nn::functional::linear(h, weight);
  };
  torch::Tensor loss;
  {
    Precision precision = *Precision::FromName(autocast ? "bf16-mixed" : "32-true");
    AutocastScope scope(precision, torch::kCPU);
    loss = chunk_tokens == 0
               ? CausalLmLoss(logits_of(hidden), labels)
               : ChunkedCausalLmLoss(hidden, labels, logits_of, {weight}, chunk_tokens,
                                     plain_head ? weight : torch::Tensor());
  }
  (loss * loss_scale).backward();
  return {loss.detach(), hidden.grad(), weight.grad()};
}

void ExpectSame(const Result& chunked, const Result& plain, double tolerance) {
  EXPECT_EQ(chunked.loss.scalar_type(), torch::kFloat32);
  EXPECT_NEAR(chunked.loss.item<double>(), plain.loss.item<double>(), tolerance);
  EXPECT_EQ(chunked.grad_hidden.scalar_type(), plain.grad_hidden.scalar_type());
  EXPECT_EQ(chunked.grad_weight.scalar_type(), plain.grad_weight.scalar_type());
  EXPECT_LT(RelativeError(chunked.grad_hidden, plain.grad_hidden), tolerance);
  EXPECT_LT(RelativeError(chunked.grad_weight, plain.grad_weight), tolerance);
}

TEST(ChunkedCausalLmLossTest, SameLossAndGradientsAsThePlainPathInFp32) {
  const Result plain = LossAndGradients(torch::kFloat32, 0, false);
  for (bool plain_head : {false, true}) {
    for (int64_t chunk : {1, 16, 111, 1000}) {
      SCOPED_TRACE("chunk_tokens " + std::to_string(chunk) + (plain_head ? ", plain head" : ""));
      ExpectSame(LossAndGradients(torch::kFloat32, chunk, false, plain_head), plain, 1e-5);
    }
  }
}

// Backward scales the gradients forward formed: a loss divided by the accumulation steps.
TEST(ChunkedCausalLmLossTest, GradientsFollowTheLossScale) {
  for (bool plain_head : {false, true}) {
    SCOPED_TRACE(plain_head ? "plain head" : "through autograd");
    const Result plain = LossAndGradients(torch::kFloat32, 0, false, false, 0.25);
    ExpectSame(LossAndGradients(torch::kFloat32, 16, false, plain_head, 0.25), plain, 1e-5);
  }
}

// A frozen head (LoRA elsewhere): only the hidden states get a gradient; without grad mode (an
// evaluation) nothing is formed and the loss is the same.
TEST(ChunkedCausalLmLossTest, FrozenHeadAndNoGradGiveTheSameLoss) {
  torch::manual_seed(0);
  const torch::Tensor weight = 0.5 * torch::randn({kVocab, kHidden});
  const torch::Tensor labels = torch::randint(0, kVocab, {kBatch, kSeq}, torch::kInt64);
  auto logits_of = [weight](const torch::Tensor& h) {
    return torch::nn::functional::linear(h, weight);
  };
  torch::Tensor hidden = torch::randn({kBatch, kSeq, kHidden}).requires_grad_(true);
  CausalLmLoss(logits_of(hidden), labels).backward();
  const torch::Tensor expected = hidden.grad().clone();
  for (bool plain_head : {false, true}) {
    SCOPED_TRACE(plain_head ? "plain head" : "through autograd");
    hidden.mutable_grad() = torch::Tensor();
    const torch::Tensor head = plain_head ? weight : torch::Tensor();
    ChunkedCausalLmLoss(hidden, labels, logits_of, {weight}, 16, head).backward();
    EXPECT_LT(RelativeError(hidden.grad(), expected), 1e-5);
    torch::NoGradGuard no_grad;
    EXPECT_NEAR(ChunkedCausalLmLoss(hidden, labels, logits_of, {weight}, 16, head).item<double>(),
                CausalLmLoss(logits_of(hidden), labels).item<double>(), 1e-5);
  }
}

// bf16 weights and hidden states: the chunks' weight gradients are summed in bf16, one rounding per
// chunk more than the plain path's single matmul. Measured: the weight's gradient 6.5e-3 off
// (relative), the rest within 1e-6.
TEST(ChunkedCausalLmLossTest, SameLossAndGradientsAsThePlainPathInBf16) {
  const Result plain = LossAndGradients(torch::kBFloat16, 0, false);
  ExpectSame(LossAndGradients(torch::kBFloat16, 16, false), plain, 1e-2);
  ExpectSame(LossAndGradients(torch::kBFloat16, 16, false, /*plain_head=*/true), plain, 1e-2);
}

// fp32 weights under bf16 autocast: the chunks go through autograd, their logits in bf16 as the
// plain path's. Measured: hidden's gradient exact, the weight's 2.8e-3 off (bf16 chunk gradients
// summed).
TEST(ChunkedCausalLmLossTest, SameLossAndGradientsUnderAutocast) {
  const Result plain = LossAndGradients(torch::kFloat32, 0, true);
  for (bool plain_head : {false, true}) {  // a plain head computes in autocast's dtype
    SCOPED_TRACE(plain_head ? "plain head" : "through autograd");
    const Result chunked = LossAndGradients(torch::kFloat32, 16, true, plain_head);
    ExpectSame(chunked, plain, 5e-3);
    EXPECT_LT(RelativeError(chunked.grad_hidden, plain.grad_hidden), 1e-5);
  }
}

// A micro-batch with every label masked (a prompt longer than max_seq_length under mask_prompt):
// the loss is 0 / 0 as cross_entropy's mean gives, and the gradients are zero, not NaN, so the
// other micro-batches' and ranks' still count.
TEST(ChunkedCausalLmLossTest, EveryLabelMaskedGivesZeroGradients) {
  torch::manual_seed(0);
  for (bool plain_head : {false, true}) {
    SCOPED_TRACE(plain_head ? "plain head" : "through autograd");
    torch::Tensor weight = torch::randn({kVocab, kHidden}).requires_grad_(true);
    torch::Tensor hidden = torch::randn({kBatch, kSeq, kHidden}).requires_grad_(true);
    const torch::Tensor labels = torch::full({kBatch, kSeq}, -100, torch::kInt64);
    auto logits_of = [weight](const torch::Tensor& h) {
      return torch::nn::functional::linear(h, weight);
    };
    ChunkedCausalLmLoss(hidden, labels, logits_of, {weight}, 16,
                        plain_head ? weight : torch::Tensor())
        .backward();
    EXPECT_EQ(hidden.grad().abs().max().item<float>(), 0.0f);
    EXPECT_EQ(weight.grad().abs().max().item<float>(), 0.0f);
  }
}

// A weight read twice (tied embeddings): its gradient from every chunk and from the embedding
// reaches .grad in one accumulation, so a post-accumulate-grad hook (offload, optimizer in
// backward) runs once.
TEST(ChunkedCausalLmLossTest, TiedWeightGradientIsAccumulatedOnce) {
  torch::manual_seed(0);
  torch::Tensor weight = (0.5 * torch::randn({kVocab, kHidden})).requires_grad_(true);
  torch::Tensor ids = torch::randint(0, kVocab, {kBatch, kSeq}, torch::kInt64);
  int accumulations = 0;
  SetPostAccumulateGradHook(weight, [&accumulations](const torch::Tensor&) { ++accumulations; });
  auto logits_of = [weight](const torch::Tensor& h) {
    return torch::nn::functional::linear(h, weight);
  };
  torch::Tensor hidden = torch::nn::functional::embedding(ids, weight);  // (B, T, C)
  ChunkedCausalLmLoss(hidden, ids, logits_of, {weight}, 8, weight).backward();
  EXPECT_EQ(accumulations, 1);
  const torch::Tensor chunked_grad = weight.grad().clone();

  weight.mutable_grad() = torch::Tensor();
  CausalLmLoss(logits_of(torch::nn::functional::embedding(ids, weight)), ids).backward();
  EXPECT_EQ(accumulations, 2);
  EXPECT_LT(RelativeError(chunked_grad, weight.grad()), 1e-5);
  SetPostAccumulateGradHook(weight, nullptr);
}

}  // namespace
}  // namespace llmctl::trainer
