// `offload: optimizer`, the labs' DeepSpeed stage-2 optimizer offload (ZeRO-Offload) on one device:
// the device keeps only the parameters in their run dtype; fp32 master weights, AdamW's moments and
// an fp32 gradient buffer per parameter live in host memory, outside the device_memory budget.
//
// Each parameter's gradient moves to its host buffer as soon as autograd has accumulated it (a
// post-accumulate-grad hook), and the device gradient is freed there, so at most about one tensor's
// gradient is on the device at a time; host buffers add up the micro-batches of an accumulated
// step. The step runs on the host (PyTorch's fused CPU AdamW kernel, multi-threaded) and the
// updated master weights are copied back into the device parameters, cast to their dtype.
//
// The device parameters carry no .grad() between backward and the step, so global-norm clipping and
// 16-mixed loss scaling (which read .grad()) are refused for offload in common/trial_config.cc.
#ifndef LLMCTL_TRAINER_TRAIN_OFFLOAD_H_
#define LLMCTL_TRAINER_TRAIN_OFFLOAD_H_

#include <torch/torch.h>

#include <memory>
#include <vector>

#include "trainer/train/optimizer.h"

namespace llmctl::trainer {

// AdamW with its state offloaded, as above. StateTensors() are all host tensors: master weights,
// exp_avg, exp_avg_sq and the gradient buffers (4 bytes each per parameter) and the fp32 step
// counter, so a snapshot shows them as optim_host_bytes and nothing as optim_device_bytes.
// NamedState() adds
// "<index>.master" to AdamW's names; a checkpoint without it (plain AdamW's) takes the masters from
// the parameters. Installs a post-accumulate-grad hook on every parameter for its lifetime.
std::unique_ptr<Optimizer> MakeOffloadedAdamW(const OptimizerOptions& options,
                                              std::vector<torch::Tensor> params);

}  // namespace llmctl::trainer

#endif  // LLMCTL_TRAINER_TRAIN_OFFLOAD_H_
