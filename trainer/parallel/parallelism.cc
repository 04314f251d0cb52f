#include "trainer/parallel/parallelism.h"

#include <string>

#include "common/flat_layout.h"
#include "trainer/parallel/ddp.h"
#include "trainer/parallel/fsdp.h"
#include "trainer/parallel/replicated.h"

namespace llmctl::trainer {

StatusOr<std::unique_ptr<Parallelism>> MakeParallelism(const TrialConfig& config,
                                                       const std::optional<dist::RankEnv>& env,
                                                       torch::Device device) {
  const TrialSettings& settings = config.settings();
  const int64_t devices = settings.device.count;
  const int64_t nodes = settings.parallel.nodes;
  const std::string strategy(Name(settings.parallel.strategy));
  // Every node's devices are ranks of one job: the data shards, the gradient average and FSDP's
  // shards are over all of them.
  const int64_t world_size = devices * nodes;
  if (DataParallelRanks(config) == 1) {
    return std::unique_ptr<Parallelism>(new SingleProcess());
  }
  const std::string ranks_text = nodes > 1 ? "nodes x devices (" + std::to_string(nodes) + " x " +
                                                 std::to_string(devices) + ")"
                                           : "devices: " + std::to_string(devices);
  if (!env) {
    return InvalidArgumentError(
        "strategy: " + strategy + " with " + ranks_text + " runs as " + std::to_string(world_size) +
        " ranks: start them with llm-train --nproc " + std::to_string(devices) +
        (nodes > 1 ? " --nnodes " + std::to_string(nodes) : "") +
        " (or torchrun, which sets RANK, WORLD_SIZE, MASTER_ADDR, ...)");
  }
  if (env->world_size != world_size) {
    return InvalidArgumentError("WORLD_SIZE=" + std::to_string(env->world_size) +
                                " but the trial has " + ranks_text + ": strategy " + strategy +
                                " runs one rank per device");
  }
  if (settings.parallel.strategy == trial::Strategy::kFsdp) {
    ASSIGN_OR_RETURN(std::unique_ptr<FullyShardedDataParallel> fsdp,
                     FullyShardedDataParallel::Join(
                         *env, device,
                         {.reshard_after_forward = settings.parallel.fsdp_reshard_after_forward,
                          .offload = settings.memory.offload == trial::Offload::kFull,
                          .alignment = ShardAlignment(Name(settings.train.optimizer))}));
    return std::unique_ptr<Parallelism>(std::move(fsdp));
  }
  ASSIGN_OR_RETURN(std::unique_ptr<DataParallel> ddp,
                   DataParallel::Join(*env, device, settings.parallel.ddp_bucket_size.bytes));
  return std::unique_ptr<Parallelism>(std::move(ddp));
}

}  // namespace llmctl::trainer
