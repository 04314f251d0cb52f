// The probe's reference training step (issue 39): one small LLaMA trial that `llm-train --probe`
// trains for a few steps on a CPU, per matmul class, and that the estimator counts the work of.
// Its measured seconds over the nominal time of its counted work at the probe's own rates is the
// node's calibration factor before any trial has run there, in place of a factor measured on
// another machine: what a step costs beyond its counted matmuls, attention, memory traffic and
// launches (GEMMs at a micro-batch's odd row counts, autograd, the allocator, caches) is then
// this machine's own. One definition for both processes: trainer/train/rate_probe.cc runs it,
// probed_speed.cc's ProbedSpeed counts it.
#ifndef LLMCTL_COMMON_ESTIMATE_REFERENCE_STEP_H_
#define LLMCTL_COMMON_ESTIMATE_REFERENCE_STEP_H_

#include <vector>

#include "common/estimate/step_work.h"
#include "common/model_config.h"
#include "common/status.h"
#include "common/trial_config.h"

namespace llmctl::estimate {

// The probe times two steps of each class a round, among its other measurements, and keeps each
// one's median over its rounds. The rows of a reference micro-batch are all full, kReferenceTokens
// long on average. One step runs every micro-batch at kReferenceTokens, a shape every step had; the
// other runs step k's two micro-batches at kReferenceTokens - d and + d tokens, d = 1 + k mod
// kReferenceLengthSpread, so each has a shape no recent step had, as a trial's padded micro-batches
// of real text often do: a CPU's 16-bit GEMMs build their kernels for each new shape (11-30, Zen
// 4, bf16: a micro-batch of the reference trial 8-12 ms dearer at a new length). Both steps do
// the same work. The first gives the factor, the difference what a new length costs.
inline constexpr int64_t kReferenceTokens = 112;
inline constexpr int64_t kReferenceLengthSpread = 16;

// A 2-layer LLaMA, 512 wide (8 heads of 64, SwiGLU 1,408), over a 4,096-token vocabulary: 8.5 M
// weights in matmuls, about 26 GFLOP a step; not any shipped model's shape.
ModelConfig ReferenceModel();

// The reference trial of matmul class `c`: random init, 2 micro-batches of 2 rows of
// kReferenceTokens (data.max_seq_length: the estimate counts full rows), AdamW, `kernels` at its
// default, on the CPU; 32-true for fp32, bf16-true for bf16.
StatusOr<TrialConfig> ReferenceTrial(MatmulClass c);

// The work of one step of ReferenceTrial(c) on ReferenceModel (step_work.h).
StatusOr<StepWork> ReferenceWork(MatmulClass c);

// The weights through which the probe times a projection's GEMMs at rows new to the process
// (rate_probe.h's new_shapes), fewest values first: two narrow squares, 128 and 256 wide, as a
// small model's projections are (the CPU lab's are 384 wide); the reference trial's own distinct
// weight shapes, whose part of the reference steps' difference ProbedSpeed takes from them; and
// 2,048 x 4,096, as a 1B model's are, past which a weight's cost grows more slowly than its values
// (12-05, Xeon with AMX, bf16: 13-16 ms at 2.1 M values, 22-30 ms at 8.4 M, 27 ms at 16.4 M).
// Between them NewLengthCost interpolates.
StatusOr<std::vector<WeightShape>> NewShapeWeights();

}  // namespace llmctl::estimate

#endif  // LLMCTL_COMMON_ESTIMATE_REFERENCE_STEP_H_
