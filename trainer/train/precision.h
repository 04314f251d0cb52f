// The labs' precision modes: which dtype parameters are stored in and which dtype the forward computes in.
#ifndef LLMCTL_TRAINER_TRAIN_PRECISION_H_
#define LLMCTL_TRAINER_TRAIN_PRECISION_H_

#include <torch/torch.h>

#include <optional>
#include <string>
#include <vector>

#include "common/status.h"

namespace llmctl::trainer {

struct Precision {
  std::string name;                     // 32-true | bf16-true | bf16-mixed | 16-mixed
  torch::Dtype param_dtype;             // storage of weights, grads and optimizer moments
  std::optional<torch::Dtype> autocast;  // compute dtype of the forward under autocast, if mixed
  bool loss_scaling = false;            // fp16 needs dynamic loss scaling to keep small grads

  static StatusOr<Precision> FromName(const std::string& name);
};

// Enables autocast for the device type while alive; clears autocast's weight-cast cache on exit (as
// torch.autocast does), so cached low-precision weight copies never outlive the forward.
class AutocastScope {
 public:
  AutocastScope(const Precision& precision, torch::Device device);
  ~AutocastScope();
  AutocastScope(const AutocastScope&) = delete;
  AutocastScope& operator=(const AutocastScope&) = delete;

 private:
  bool active_ = false;
  c10::DeviceType device_type_;
  bool previous_enabled_ = false;
  at::ScalarType previous_dtype_ = at::kFloat;
};

// Dynamic loss scaling for 16-mixed, with torch.amp.GradScaler's defaults: start at 2^16, halve on a
// non-finite gradient (skipping that step), double after 2000 finite steps.
class LossScaler {
 public:
  explicit LossScaler(torch::Device device);
  double scale() const { return scale_; }
  void set_scale(double scale) { scale_ = scale; }
  // Divides gradients by the scale; returns false when any is non-finite (the step must be skipped).
  bool UnscaleAndCheck(const std::vector<torch::Tensor>& params);
  void Update(bool grads_were_finite);

 private:
  torch::Device device_;
  double scale_ = 65536.0;
  int64_t good_steps_ = 0;
};

}  // namespace llmctl::trainer

#endif  // LLMCTL_TRAINER_TRAIN_PRECISION_H_
