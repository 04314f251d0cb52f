// ATen's CPU fp32 results that vary with the vector unit or the thread count, computed in scalar
// code in the order ATen's AVX2 build uses, so that they are the same bits on every CPU: what
// bitsandbytes gives on an AVX2 CPU, where its fixtures (tests/fixtures/quant) were made.
// Internal to trainer/quant/ (quant.cc: the dynamic map's codes, the NF4 offset).
#ifndef LLMCTL_TRAINER_QUANT_ATEN_ROUNDING_H_
#define LLMCTL_TRAINER_QUANT_ATEN_ROUNDING_H_

#include <cstdint>
#include <vector>

namespace llmctl::trainer::aten_rounding {

// torch.linspace(start, end, steps) in fp32 as ATen's CPU kernel computes it
// (aten/src/ATen/native/cpu/RangeFactoriesKernel.cpp): step = (end - start) / (steps - 1), the
// first half start + step * i, the second half end - step * (steps - 1 - i). ATen's AVX2 (and
// AVX-512) build of that kernel compiles each a * b + c into one fused multiply-add, its default
// build into a multiply and an add, which moves 42 signed and 31 unsigned dynamic-map codes;
// bitsandbytes' fixtures come from the fused form, as on any x86 CPU with AVX2. std::fma rounds
// once on every CPU, so this gives the fused values whatever ATen dispatches to.
std::vector<float> LinspaceAsAvx2(float start, float end, int64_t steps);

// x.mean() of n contiguous fp32 values in the order ATen's single-threaded CPU sum takes with
// 8-float vectors (AVX2 and the default build): 8 lanes through AtenRowSum, the tail, then the
// lanes in order; fewer than 8 values as single floats. The sum is then divided by n in fp32, as
// ATen's mean does on CPU.
//
// Why not x.mean(): its rounding depends on the CPU and thread count. An AVX-512 build sums 16
// lanes (the same order with 16 lanes moves the NF4 offset by an ulp for 10 of the 17 fixture
// weights), and from 32768 values with several threads ATen splits the sum between the threads.
// bitsandbytes takes that same torch mean, so its own offset is no more fixed; this reproduces it
// as computed on an AVX2 CPU with one thread (with any thread count below 32768 blocks: weights
// under 2M elements at blocksize 64), which is how the fixtures were made, and gives the same bits
// on every CPU. A sum in double rounded once would be simpler but matches only 11 of the 17
// fixture offsets (and differs from ATen's AVX2 mean for about a third of random inputs).
float MeanInAten8LaneOrder(const float* x, int64_t n);

}  // namespace llmctl::trainer::aten_rounding

#endif  // LLMCTL_TRAINER_QUANT_ATEN_ROUNDING_H_
