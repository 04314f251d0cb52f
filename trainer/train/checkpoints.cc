#include "trainer/train/checkpoints.h"

#include <ATen/CPUGeneratorImpl.h>

#include <filesystem>
#include <fstream>
#include <map>

#include "common/atomic_file.h"
#include "common/rank_files.h"
#include "common/data/file_util.h"
#include "trainer/model/weights.h"
#include "common/safetensors/safetensors.h"

namespace llmctl::trainer {
namespace {

namespace fs = std::filesystem;

constexpr int kFormatVersion = 1;

}  // namespace

StatusOr<NamedTensors> ReadTensors(const std::string& path) {
  ASSIGN_OR_RETURN(auto file, safetensors::SafetensorsFile::Open(path));
  NamedTensors tensors;
  for (const safetensors::TensorView& view : file->tensors()) {
    tensors.emplace_back(view.name, TensorFromView(view).clone());
  }
  return tensors;
}

Status WriteTensors(const std::string& path, const NamedTensors& tensors,
                    const std::map<std::string, std::string>& metadata) {
  std::vector<torch::Tensor> keep_alive;  // contiguous CPU copies the spans point into
  std::vector<safetensors::TensorToWrite> to_write;
  keep_alive.reserve(tensors.size());
  for (const auto& [name, tensor] : tensors) {
    keep_alive.push_back(tensor.detach().to(torch::kCPU).contiguous());
    const torch::Tensor& t = keep_alive.back();
    ASSIGN_OR_RETURN(safetensors::DType dtype, SafetensorsDtype(t.scalar_type()));
    to_write.push_back(
        {name, dtype, t.sizes().vec(),
         std::span<const std::byte>(static_cast<const std::byte*>(t.data_ptr()), t.nbytes())});
  }
  return safetensors::WriteSafetensors(path, to_write, metadata);
}

NamedTensors GeneratorStates() {
  NamedTensors states;
  states.emplace_back("cpu", at::detail::getDefaultCPUGenerator().get_state());
  return states;
}

Status RestoreGeneratorStates(const NamedTensors& states) {
  for (const auto& [name, state] : states) {
    if (name != "cpu") return DataLossError("unknown generator '" + name + "' in checkpoint");
    at::Generator generator = at::detail::getDefaultCPUGenerator();
    generator.set_state(state.to(torch::kCPU).contiguous());
  }
  return Status::Ok();
}

NamedTensors ModelState(torch::nn::Module& model) {
  NamedTensors state;
  for (const auto& item : model.named_parameters()) state.emplace_back(item.key(), item.value());
  for (const auto& item : model.named_buffers()) state.emplace_back(item.key(), item.value());
  return state;
}

uint64_t CheckpointBytes(const NamedTensors& model, const NamedTensors& optimizer) {
  // A safetensors header entry (name, dtype, shape, offsets) stays well under this per tensor;
  // trainer_state.json holds the resolved config and the data position, a few KiB.
  constexpr uint64_t kHeaderBytesPerTensor = 256;
  constexpr uint64_t kStateFileBytes = 64 * 1024;
  uint64_t bytes = kStateFileBytes;
  for (const NamedTensors* tensors : {&model, &optimizer}) {
    for (const auto& [name, tensor] : *tensors) {
      bytes += static_cast<uint64_t>(tensor.nbytes()) + kHeaderBytesPerTensor;
    }
  }
  for (const auto& [name, state] : GeneratorStates()) {
    bytes += static_cast<uint64_t>(state.nbytes()) + kHeaderBytesPerTensor;
  }
  return bytes;
}

Status SaveCheckpoint(const std::string& dir, const NamedTensors& model,
                      const NamedTensors& optimizer, const TrainingState& state,
                      const std::function<Status(const std::string& staging_dir)>& before_rename) {
  const fs::path final_dir(dir);
  const fs::path staging = final_dir.string() + ".tmp";
  std::error_code error;
  fs::remove_all(staging, error);
  fs::create_directories(staging, error);
  if (error) return UnavailableError("cannot create " + staging.string() + ": " + error.message());
  RETURN_IF_ERROR(WriteTensors((staging / "model.safetensors").string(), model));
  RETURN_IF_ERROR(WriteTensors((staging / RankOptimizerFile(0)).string(), optimizer));
  RETURN_IF_ERROR(WriteTensors((staging / "rng.safetensors").string(), GeneratorStates()));
  const nlohmann::json json{{"format_version", kFormatVersion},
                            {"next_step", state.next_step},
                            {"data_position", state.data_position},
                            {"loss_scale", state.loss_scale},
                            {"config", state.config}};
  const std::string text = json.dump(2) + "\n";
  RETURN_IF_ERROR(WriteFileAtomically((staging / kCheckpointStateFile).string(), [&](int fd) {
    return WriteAll(fd, text.data(), text.size());
  }));
  if (before_rename) RETURN_IF_ERROR(before_rename(staging.string()));
  fs::remove_all(final_dir, error);
  fs::rename(staging, final_dir, error);
  if (error) return UnavailableError("cannot rename " + staging.string() + ": " + error.message());
  return Status::Ok();
}

StatusOr<LoadedCheckpoint> LoadCheckpoint(const std::string& dir) {
  const fs::path root(dir);
  const std::string state_path = (root / kCheckpointStateFile).string();
  ASSIGN_OR_RETURN(std::string text, ReadFileToString(state_path));
  LoadedCheckpoint loaded;
  try {
    const nlohmann::json json = nlohmann::json::parse(text);
    if (json.value("format_version", 0) != kFormatVersion) {
      return DataLossError(state_path + ": unsupported checkpoint format_version " +
                           json.value("format_version", nlohmann::json()).dump());
    }
    loaded.state.next_step = json.at("next_step").get<int64_t>();
    loaded.state.data_position = json.at("data_position");
    loaded.state.loss_scale = json.at("loss_scale").get<double>();
    loaded.state.config = json.value("config", nlohmann::json::object());
  } catch (const nlohmann::json::exception& e) {
    return DataLossError(state_path + ": " + e.what());
  }
  ASSIGN_OR_RETURN(loaded.model, ReadTensors((root / "model.safetensors").string()));
  ASSIGN_OR_RETURN(loaded.optimizer, ReadTensors((root / RankOptimizerFile(0)).string()));
  ASSIGN_OR_RETURN(loaded.generators, ReadTensors((root / "rng.safetensors").string()));
  return loaded;
}

}  // namespace llmctl::trainer
