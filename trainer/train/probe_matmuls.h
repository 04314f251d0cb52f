// The rate probe's matmul cells (rate_probe.cc), each added to the probe's rounds: a projection's
// GEMMs over a grid of shapes, a vocabulary head's, and a projection's at row counts new to the
// process; and the buffers the head's GEMMs take from the allocator. Internal to trainer/train/:
// not part of its API.
#ifndef LLMCTL_TRAINER_TRAIN_PROBE_MATMULS_H_
#define LLMCTL_TRAINER_TRAIN_PROBE_MATMULS_H_

#include <string>

#include "common/estimate/rate_probe.h"
#include "common/status.h"
#include "trainer/train/probe_rounds.h"

namespace llmctl::trainer {

// fp32 and bf16 over the whole grid (the estimate's two matmul classes); fp16, which no estimate
// uses, at the grid's first rows and two narrowest widths, for `llmctl nodes`. A cell whose call
// would take longer than `longest_call` is left out, and so is every dearer one of its dtype.
void AddMatmulGrid(ProbeRounds& rounds, double longest_call, estimate::RateProbe& probe);

// `dtype`'s vocabulary head cells, narrowest first; cut as the grid's. A CPU's.
void AddHeadMatmuls(ProbeRounds& rounds, const std::string& dtype, double longest_call,
                    estimate::RateProbe& probe);

// What each measured head cell's GEMMs take from LibTorch's allocator beside their operands and
// output (common/estimate/matmul_buffers.h). A CPU's: run after the rounds.
Status AddHeadBuffers(estimate::RateProbe& probe);

// A projection's GEMMs at a row count every call had and at row counts new to the process, fp32
// and bf16, at each of estimate::NewShapeWeights. A CPU's.
Status AddNewShapes(ProbeRounds& rounds, estimate::RateProbe& probe);

}  // namespace llmctl::trainer

#endif  // LLMCTL_TRAINER_TRAIN_PROBE_MATMULS_H_
