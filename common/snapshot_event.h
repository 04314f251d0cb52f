// The trainer's `snapshot` event (a memory snapshot at a point of the step), one spelling for every
// process that reads it: llm-train writes it, the agent streams it, the controller stores it in
// SQLite and its report views select from it, and the estimator's tests compare with it. A renamed
// phase or field fails to compile where it is used, not at run time in another process.
#ifndef LLMCTL_COMMON_SNAPSHOT_EVENT_H_
#define LLMCTL_COMMON_SNAPSHOT_EVENT_H_

#include <array>
#include <string_view>

namespace llmctl::snapshot_event {

inline constexpr std::string_view kType = "snapshot";

// The event's `phase`: where in the step it was taken (trainer/train/trainer.h), in step order.
inline constexpr std::string_view kBeforeForward = "phase0_before_fwd";
inline constexpr std::string_view kAfterForward = "phase1_after_fwd";
inline constexpr std::string_view kAfterBackward = "phase2_after_bwd";
inline constexpr std::string_view kAfterOptimizerStep = "phase3_after_opt_step";
// Taken where an allocation failed (its micro_batch is -1).
inline constexpr std::string_view kAtOom = "oom";
// Every phase, in the order reports list them.
inline constexpr std::array<std::string_view, 5> kPhases = {
    kBeforeForward, kAfterForward, kAfterBackward, kAfterOptimizerStep, kAtOom};

// Where it was taken.
inline constexpr std::string_view kStep = "step";
inline constexpr std::string_view kMicroBatch = "micro_batch";
inline constexpr std::string_view kPhase = "phase";
inline constexpr std::string_view kElapsedMs = "elapsed_ms";

// Its bytes: memory accounting's categories (trainer/memory/accounting.h) and the allocator's
// counters.
inline constexpr std::string_view kParamsBytes = "params_bytes";
inline constexpr std::string_view kGradsBytes = "grads_bytes";
inline constexpr std::string_view kOptimDeviceBytes = "optim_device_bytes";
inline constexpr std::string_view kOptimHostBytes = "optim_host_bytes";
inline constexpr std::string_view kCommBytes = "comm_bytes";
inline constexpr std::string_view kGatheredBytes = "gathered_bytes";
inline constexpr std::string_view kOtherBytes = "other_bytes";
inline constexpr std::string_view kAllocatedBytes = "allocated_bytes";
inline constexpr std::string_view kPeakBytes = "peak_bytes";
inline constexpr std::string_view kReservedBytes = "reserved_bytes";
inline constexpr std::array<std::string_view, 10> kByteFields = {
    kParamsBytes,   kGradsBytes, kOptimDeviceBytes, kOptimHostBytes, kCommBytes,
    kGatheredBytes, kOtherBytes, kAllocatedBytes,   kPeakBytes,      kReservedBytes};

}  // namespace llmctl::snapshot_event

#endif  // LLMCTL_COMMON_SNAPSHOT_EVENT_H_
