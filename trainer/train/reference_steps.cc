#include "trainer/train/reference_steps.h"

#include <string>
#include <utility>

#include "trainer/train/batches.h"

namespace llmctl::trainer {

StatusOr<std::unique_ptr<ReferenceTrainer>> ReferenceTrainer::Make(
    estimate::MatmulClass matmul_class) {
  auto trainer = std::unique_ptr<ReferenceTrainer>(new ReferenceTrainer());
  ASSIGN_OR_RETURN(trainer->config_, estimate::ReferenceTrial(matmul_class));
  const TrialSettings& s = trainer->config_.settings();
  torch::manual_seed(0);
  ModelBuildOptions build;
  build.init = "random";
  build.dtype = matmul_class == estimate::MatmulClass::kBf16 ? torch::kBFloat16 : torch::kFloat32;
  build.kernels = KernelsNamed(std::string(Name(s.memory.kernels)));
  ASSIGN_OR_RETURN(trainer->trained_, BuildTrainedModel(trainer->model_, build));
  trainer->trained_->module().train();
  for (const torch::Tensor& p : trainer->trained_->module().parameters()) {
    if (p.requires_grad()) trainer->params_.push_back(p);
  }
  ASSIGN_OR_RETURN(trainer->optimizer_, MakeOptimizer(OptimizerOptionsOf(s), trainer->params_));
  trainer->chunked_ = UsesChunkedLoss(trainer->config_);
  return trainer;
}

void ReferenceTrainer::Step(bool new_lengths) {
  const TrialSettings& s = config_.settings();
  const int64_t rows = s.train.micro_batch_size;
  const int64_t accumulation = s.train.global_batch_size / rows;
  const int64_t spread =
      new_lengths ? 1 + new_length_steps_++ % estimate::kReferenceLengthSpread : 0;
  std::vector<MicroBatch> batches;
  for (int64_t i = 0; i < accumulation; ++i) {
    const int64_t tokens = estimate::kReferenceTokens + (i % 2 == 0 ? -spread : spread);
    MicroBatch batch;
    batch.input_ids = torch::randint(model_.vocab_size, {rows, tokens}, torch::kLong);
    batch.labels = batch.input_ids.clone();
    batch.attention_mask = torch::ones({rows, tokens}, torch::kBool);
    batch.label_tokens = rows * (tokens - 1);
    batch.real_tokens = rows * tokens;
    batches.push_back(std::move(batch));
  }
  torch::AutoGradMode grad_mode(true);
  for (torch::Tensor& p : params_) p.mutable_grad() = torch::Tensor();
  for (const MicroBatch& batch : batches) {
    (trained_->Loss(batch, chunked_) / static_cast<double>(accumulation)).backward();
  }
  if (s.train.grad_clip > 0) ClipGradNorm(params_, s.train.grad_clip);
  optimizer_->Step(s.train.lr);
}

StatusOr<std::vector<std::unique_ptr<ReferenceTrainer>>> AddReferenceSteps(
    ProbeRounds& rounds, estimate::RateProbe& probe) {
  std::vector<std::unique_ptr<ReferenceTrainer>> trainers;
  for (const auto& [matmul_class, dtype] : {std::pair{estimate::MatmulClass::kFp32, "fp32"},
                                            std::pair{estimate::MatmulClass::kBf16, "bf16"}}) {
    ASSIGN_OR_RETURN(std::unique_ptr<ReferenceTrainer> trainer,
                     ReferenceTrainer::Make(matmul_class));
    ReferenceTrainer* step = trainer.get();
    // Each class at repeated lengths and at new ones: the difference is what a micro-batch of a
    // new length costs (a CPU's 16-bit GEMMs build their kernels for each new shape).
    for (const bool new_lengths : {false, true}) {
      const size_t row = probe.reference_steps.size();
      probe.reference_steps.push_back({dtype, 0, new_lengths});
      auto run = [step, new_lengths] { step->Step(new_lengths); };
      auto record = [&probe, row](double seconds) { probe.reference_steps[row].seconds = seconds; };
      // Add's two timed calls warm the trainer up (the first creates the optimizer's state); after
      // them every step at new lengths is one a trial's could be, its first as much as any.
      if (new_lengths) {
        rounds.AddWarm(run, record);
      } else {
        rounds.Add(run, record);
      }
    }
    trainers.push_back(std::move(trainer));
  }
  return trainers;
}

}  // namespace llmctl::trainer
