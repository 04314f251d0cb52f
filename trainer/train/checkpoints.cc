#include "trainer/train/checkpoints.h"

#include <ATen/CPUGeneratorImpl.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>

#include "common/atomic_file.h"
#include "common/data/file_util.h"
#include "common/foreign_json.h"
#include "common/rank_files.h"
#include "common/safetensors/safetensors.h"
#include "trainer/model/weights.h"

namespace llmctl::trainer {
namespace {

namespace fs = std::filesystem;

constexpr int kFormatVersion = 1;

// The file's tensors as views of its mapping, which `files` keeps.
StatusOr<NamedTensors> MapTensors(
    const std::string& path, std::vector<std::unique_ptr<safetensors::SafetensorsFile>>& files) {
  ASSIGN_OR_RETURN(auto file, safetensors::SafetensorsFile::Open(path));
  NamedTensors tensors;
  for (const safetensors::TensorView& view : file->tensors()) {
    tensors.emplace_back(view.name, TensorFromView(view));
  }
  files.push_back(std::move(file));
  return tensors;
}

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
    // The state is LibTorch's bytes of the generator (a checkpoint may come from another node):
    // the same type and size as this one's, and what set_state itself refuses is a refusal too.
    const torch::Tensor current = generator.get_state();
    if (state.scalar_type() != current.scalar_type() || state.numel() != current.numel()) {
      return DataLossError("generator state 'cpu' is not a CPU generator's (" +
                           std::to_string(current.numel()) + " bytes)");
    }
    try {
      generator.set_state(state.to(torch::kCPU).contiguous());
    } catch (const c10::Error& e) {
      return DataLossError("generator state 'cpu': " + std::string(e.what_without_backtrace()));
    }
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

namespace {

// SaveCheckpoint's work; on a failure `staging` may hold part of the checkpoint.
Status StageAndRename(const fs::path& final_dir, const fs::path& staging, const NamedTensors& model,
                      const NamedTensors& optimizer, const TrainingState& state,
                      const std::function<Status(const std::string& staging_dir)>& before_rename) {
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
  // The rename lives in checkpoints/: until that is synced, a power loss can take step-N away
  // although the checkpoint was reported written.
  return SyncDirectoryOf(final_dir.string()).WithContext("checkpoint " + final_dir.string());
}

}  // namespace

Status SaveCheckpoint(const std::string& dir, const NamedTensors& model,
                      const NamedTensors& optimizer, const TrainingState& state,
                      const std::function<Status(const std::string& staging_dir)>& before_rename) {
  const fs::path staging = dir + kCheckpointStagingSuffix;
  Status saved = StageAndRename(dir, staging, model, optimizer, state, before_rename);
  if (!saved.ok()) {
    // What was written would keep the disk as full as it made it (tens of GB for a large model).
    std::error_code ignored;
    fs::remove_all(staging, ignored);
  }
  return saved;
}

Status RemoveCheckpointStaging(const std::string& checkpoints_dir) {
  std::error_code error;
  if (!fs::exists(checkpoints_dir, error) && !error) return Status::Ok();
  for (auto it = fs::directory_iterator(checkpoints_dir, error);
       !error && it != fs::directory_iterator(); it.increment(error)) {
    const std::string name = it->path().filename().string();
    if (!name.starts_with("step-") || !name.ends_with(kCheckpointStagingSuffix) ||
        it->is_symlink(error) || !it->is_directory(error)) {
      continue;
    }
    std::error_code removing;
    fs::remove_all(it->path(), removing);
    if (removing) {
      return UnavailableError("cannot remove " + it->path().string() + ": " + removing.message());
    }
  }
  if (error) return UnavailableError("cannot list " + checkpoints_dir + ": " + error.message());
  return Status::Ok();
}

StatusOr<LoadedCheckpoint> LoadCheckpoint(const std::string& dir) {
  const fs::path root(dir);
  const std::string state_path = (root / kCheckpointStateFile).string();
  // A few hundred bytes as SaveCheckpoint writes it; the file may have come from another node.
  ASSIGN_OR_RETURN(std::string text, ReadFileToString(state_path, size_t{1} << 20));
  LoadedCheckpoint loaded;
  // A checkpoint may come from another node or a path the user gave: every member is checked for
  // its type and range (a float read as an integer past its range is undefined, not an exception).
  const nlohmann::json json = ParseForeignJson(text);
  if (!json.is_object()) return DataLossError(state_path + ": not a JSON object");
  const auto member = [&json](const char* key) -> const nlohmann::json* {
    const auto found = json.find(key);
    return found == json.end() ? nullptr : &*found;
  };
  const nlohmann::json* version = member("format_version");
  if (version != nullptr && version->is_number_integer() && *version > kFormatVersion) {
    return DataLossError(state_path + ": checkpoint format_version " + ShortJson(*version) +
                         " is newer than this llm-train reads (" + std::to_string(kFormatVersion) +
                         "): a newer llm-train wrote it; resume with that one");
  }
  if (version == nullptr || !version->is_number_integer() || *version != kFormatVersion) {
    return DataLossError(state_path + ": unsupported checkpoint format_version " +
                         (version == nullptr ? std::string("(none)") : ShortJson(*version)));
  }
  const nlohmann::json* next_step = member("next_step");
  if (next_step == nullptr || !next_step->is_number_integer() || next_step->get<int64_t>() < 0) {
    return DataLossError(state_path + ": next_step must be a step count");
  }
  const nlohmann::json* position = member("data_position");
  const nlohmann::json* loss_scale = member("loss_scale");
  if (position == nullptr) return DataLossError(state_path + ": no data_position");
  if (loss_scale == nullptr || !loss_scale->is_number() ||
      !std::isfinite(loss_scale->get<double>()) || !(loss_scale->get<double>() >= 0)) {
    // 0 outside 16-mixed, which scales its loss.
    return DataLossError(state_path + ": loss_scale must be a finite non-negative number");
  }
  loaded.state.next_step = next_step->get<int64_t>();
  loaded.state.data_position = *position;
  loaded.state.loss_scale = loss_scale->get<double>();
  const nlohmann::json* config = member("config");
  loaded.state.config = config != nullptr ? *config : nlohmann::json::object();
  ASSIGN_OR_RETURN(loaded.model, MapTensors((root / "model.safetensors").string(), loaded.files));
  ASSIGN_OR_RETURN(loaded.optimizer,
                   MapTensors((root / RankOptimizerFile(0)).string(), loaded.files));
  ASSIGN_OR_RETURN(loaded.generators,
                   MapTensors((root / "rng.safetensors").string(), loaded.files));
  return loaded;
}

}  // namespace llmctl::trainer
