// The largest micro-batch that fits a device (step_memory.h's FitMicroBatch and FitMicroBatchWith):
// a bisection over the peak, which grows with the micro-batch.
#include <algorithm>
#include <string>

#include "common/estimate/step_memory.h"

namespace llmctl::estimate {

StatusOr<MicroBatchFit> FitMicroBatch(const TrialConfig& config, const ModelConfig& model,
                                      uint64_t device_bytes, const MatmulBuffers& buffers) {
  ASSIGN_OR_RETURN(const ModelStateEstimate state, EstimateModelState(config, model));
  return FitMicroBatchWith(
      config, state.world_size, device_bytes, [&](const TrialConfig& c) -> StatusOr<uint64_t> {
        ASSIGN_OR_RETURN(StepMemoryEstimate e, EstimateStepMemory(c, model, buffers));
        return e.peak_bytes;
      });
}

StatusOr<MicroBatchFit> FitMicroBatchWith(const TrialConfig& config, int64_t world_size,
                                          uint64_t device_bytes, const PeakOf& peak_of) {
  const int64_t world = world_size;
  const int64_t global = config.settings().train.global_batch_size;
  auto peak_at = [&](int64_t micro) -> StatusOr<uint64_t> {
    TrialConfig c = config;
    RETURN_IF_ERROR(c.Set("train.micro_batch_size", micro));
    // Any accumulation of two or more micro-batches peaks alike: the gradients are held.
    const int64_t per_step = micro * world;
    RETURN_IF_ERROR(c.Set("train.global_batch_size", per_step < global ? 2 * per_step : per_step));
    return peak_of(c);
  };
  MicroBatchFit fit;
  ASSIGN_OR_RETURN(const uint64_t at_one, peak_at(1));
  if (at_one > device_bytes) {
    fit.peak_bytes = at_one;
    return fit;
  }
  int64_t low = 1;                       // fits
  int64_t high = kMaxFitMicroBatch + 1;  // does not (or is past the search)
  while (high - low > 1) {
    const int64_t mid = low + (high - low) / 2;
    ASSIGN_OR_RETURN(const uint64_t peak, peak_at(mid));
    (peak <= device_bytes ? low : high) = mid;
  }
  fit.micro_batch_size = low;
  ASSIGN_OR_RETURN(fit.peak_bytes, peak_at(low));
  if (low < kMaxFitMicroBatch) {
    ASSIGN_OR_RETURN(fit.next_peak_bytes, peak_at(low + 1));
  }
  for (int64_t micro = std::min(low, global / world); micro >= 1; --micro) {
    if (global % (micro * world) == 0) {
      fit.global_micro_batch_size = micro;
      fit.accumulation = global / (micro * world);
      break;
    }
  }
  return fit;
}

}  // namespace llmctl::estimate
