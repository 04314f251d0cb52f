// llm-c10d-check's work: every collective the data-parallel trainers need, run through a real c10d
// process group on values whose result is known exactly, verified on every rank and timed.
#ifndef LLMCTL_TRAINER_DIST_C10D_CHECK_H_
#define LLMCTL_TRAINER_DIST_C10D_CHECK_H_

#include <cstdint>
#include <optional>
#include <ostream>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "trainer/dist/process_group.h"
#include "trainer/dist/rank_env.h"

namespace llmctl::dist {

// llm-c10d-check's exit codes.
inline constexpr int kCheckExitOk = 0;
inline constexpr int kCheckExitFailed = 1;      // a wrong result, a failed collective, a dead rank
inline constexpr int kCheckExitUsage = 2;       // bad flags or environment
inline constexpr int kCheckExitGpuPerRank = 3;  // NCCL asked for with fewer GPUs than ranks
inline constexpr int kCheckExitNoCuda = 4;      // --device cuda on a machine without CUDA

enum class DeviceKind { kCpu, kCuda };

// "cpu" or "cuda"; InvalidArgument naming the value otherwise.
StatusOr<DeviceKind> ParseDeviceKind(std::string_view name);
std::string_view DeviceKindName(DeviceKind kind);

struct CheckOptions {
  BackendKind backend = BackendKind::kGloo;
  DeviceKind device = DeviceKind::kCpu;
  // Flat tensor lengths to run each collective on; all-gather and reduce-scatter pad them to a
  // multiple of the world size, as FSDP pads a flat parameter.
  std::vector<int64_t> numels = {1, 4099, 1000003, 16777216};
  std::chrono::milliseconds rendezvous_timeout{std::chrono::seconds(60)};
};

// Why this machine cannot run the check as asked, with the exit code to leave with.
struct Refusal {
  int exit_code = kCheckExitUsage;
  std::string message;
};

// Checked before any rank starts (and again by each rank): NCCL only with --device cuda and one
// distinct GPU for each of the `local_ranks` ranks on this machine; --device cuda only with a CUDA
// device.
std::optional<Refusal> RefuseMachine(const CheckOptions& options, int local_ranks);

// One rank of the check: joins the group `env` describes, runs every collective on every dtype
// (float32, bfloat16) and length, and verifies each result on every rank. Rank 0 writes one JSON
// object per collective to `out` (backend, device, world_size, op, reduce, dtype, numel, bytes, ok,
// seconds, algbw_gbps); every rank writes what went wrong to `err`. Returns the exit code.
int RunCheckRank(const RankEnv& env, const CheckOptions& options, std::ostream& out,
                 std::ostream& err);

}  // namespace llmctl::dist

#endif  // LLMCTL_TRAINER_DIST_C10D_CHECK_H_
