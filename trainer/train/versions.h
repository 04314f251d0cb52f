// The versions llm-train reports (llm-train --version): llmctl's, LibTorch's and the CUDA it was
// built for, and on a machine with a usable GPU the CUDA runtime's and the NVIDIA driver's.
#ifndef LLMCTL_TRAINER_TRAIN_VERSIONS_H_
#define LLMCTL_TRAINER_TRAIN_VERSIONS_H_

#include "common/trainer_versions.h"

namespace llmctl::trainer {

// Never fails: what cannot be known (no GPU, no NVIDIA driver) stays empty.
TrainerVersions ProbeTrainerVersions();

}  // namespace llmctl::trainer

#endif  // LLMCTL_TRAINER_TRAIN_VERSIONS_H_
