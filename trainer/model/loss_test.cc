// ChunkedCausalLmLoss against CausalLmLoss over the full logits: the same loss and gradients.
#include "trainer/model/loss.h"

#include <gtest/gtest.h>

#include <algorithm>

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

// 16-mixed forms the chunks' gradients in fp16, whose smallest value is 6e-8. A logit's gradient
// is its probability over the scored tokens: at the start of training about 1 / (V x count), here
// 1 / (50,000 x 206) = 1e-10. Formed at that size it would round to 0 before the loss scale
// (65,536, the scaler's first) reaches it in backward, and the gradients would lose the softmax's
// pull away from every token but the label. The plain path, whose loss gradient carries the
// scale from the start, is the reference; both against fp32's.
TEST(ChunkedCausalLmLossTest, Fp16ChunksKeepWhatTheLossScaleKeeps) {
  constexpr int64_t kLargeVocab = 50000;
  constexpr double kLossScale = 65536;
  torch::manual_seed(0);
  const torch::Tensor hidden0 = torch::randn({2, 150, kHidden});
  const torch::Tensor weight0 = 0.02 * torch::randn({kLargeVocab, kHidden});
  torch::Tensor labels = torch::randint(0, kLargeVocab, {2, 150}, torch::kInt64);
  labels.masked_fill_(torch::rand({2, 150}) < 0.3, -100);
  struct Grads {
    torch::Tensor hidden, weight;
  };
  // chunk_tokens 0: the plain path. `plain_head`: the chunks' plain-head route, else autograd's.
  auto gradients = [&](const char* precision, int64_t chunk_tokens, bool plain_head) {
    torch::Tensor hidden = hidden0.clone().requires_grad_(true);
    torch::Tensor weight = weight0.clone().requires_grad_(true);
    auto logits_of = [weight](const torch::Tensor& h) {
      return torch::nn::functional::linear(h, weight);
    };
    torch::Tensor loss;
    {
      AutocastScope scope(*Precision::FromName(precision), torch::kCPU);
      loss = chunk_tokens == 0
                 ? CausalLmLoss(logits_of(hidden), labels)
                 : ChunkedCausalLmLoss(hidden, labels, logits_of, {weight}, chunk_tokens,
                                       plain_head ? weight : torch::Tensor());
    }
    (loss * kLossScale).backward();
    return Grads{hidden.grad() / kLossScale, weight.grad() / kLossScale};
  };
  const Grads fp32 = gradients("32-true", 0, false);
  const Grads plain = gradients("16-mixed", 0, false);
  // What fp16's rounding costs the plain path: the bound the chunks must meet too.
  const double hidden_bound = 2 * std::max(RelativeError(plain.hidden, fp32.hidden), 1e-3);
  const double weight_bound = 2 * std::max(RelativeError(plain.weight, fp32.weight), 1e-3);
  for (bool plain_head : {false, true}) {
    SCOPED_TRACE(plain_head ? "plain head" : "through autograd");
    const Grads chunked = gradients("16-mixed", 64, plain_head);
    EXPECT_LT(RelativeError(chunked.hidden, fp32.hidden), hidden_bound);
    EXPECT_LT(RelativeError(chunked.weight, fp32.weight), weight_bound);
  }
}

}  // namespace
}  // namespace llmctl::trainer
