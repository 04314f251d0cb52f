#include "trainer/train/ranks.h"

#include <stdexcept>
#include <string>
#include <utility>

namespace llmctl::trainer {

StatusOr<Ranks> Ranks::Join(const TrialConfig& config, const std::optional<dist::RankEnv>& env,
                            torch::Device device) {
  Ranks ranks;
  const int64_t devices = config.GetInt("devices");
  const int64_t nodes = config.GetInt("nodes");
  const std::string strategy = config.GetString("strategy");
  // Every node's devices are ranks of one job: the data shards, the gradient average and FSDP's
  // shards are over all of them.
  const int64_t world_size = devices * nodes;
  if ((strategy != "ddp" && strategy != "fsdp") || world_size == 1) return ranks;
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
  if (strategy == "fsdp") {
    ASSIGN_OR_RETURN(ranks.fsdp_, FullyShardedDataParallel::Join(*env, device));
  } else {
    ASSIGN_OR_RETURN(ranks.ddp_, DataParallel::Join(*env, device));
  }
  return ranks;
}

int Ranks::rank() const {
  if (ddp_) return ddp_->rank();
  if (fsdp_) return fsdp_->rank();
  return 0;
}

int64_t Ranks::world_size() const {
  if (ddp_) return ddp_->world_size();
  if (fsdp_) return fsdp_->world_size();
  return 1;
}

std::vector<double> Ranks::SumAcrossRanks(const std::vector<double>& values) {
  if (!distributed()) return values;
  auto sums = ddp_ ? ddp_->SumAcrossRanks(values) : fsdp_->SumAcrossRanks(values);
  if (!sums.ok()) throw std::runtime_error(sums.status().message());
  return *std::move(sums);
}

std::vector<torch::Tensor> Ranks::CommTensors() const {
  if (ddp_) return ddp_->CommTensors();
  if (fsdp_) return fsdp_->CommTensors();
  return {};
}

std::vector<torch::Tensor> Ranks::GatheredTensors() const {
  return fsdp_ ? fsdp_->GatheredTensors() : std::vector<torch::Tensor>{};
}

}  // namespace llmctl::trainer
