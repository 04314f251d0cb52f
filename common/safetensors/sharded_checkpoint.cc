#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <system_error>

#include "common/files.h"
#include "common/safetensors/safetensors.h"
#include "common/safetensors/strict_json.h"
#include "common/text.h"

namespace llmctl::safetensors {
namespace {

using Json = nlohmann::json;
using internal::JsonTypeName;
using internal::kMaxQuotedBytes;
using internal::ParseJsonStrict;

// The index's "metadata", values that are not strings as their JSON text; empty when it has none.
StatusOr<std::map<std::string, std::string>> IndexMetadata(const std::string& index_path,
                                                           const Json& index) {
  std::map<std::string, std::string> metadata;
  if (!index.contains("metadata") || index["metadata"].is_null()) return metadata;
  const Json& meta = index["metadata"];
  if (!meta.is_object()) {
    return DataLossError(index_path + ": 'metadata' must be an object, got " + JsonTypeName(meta));
  }
  for (const auto& [key, value] : meta.items()) {
    metadata[key] = value.is_string() ? value.get<std::string>() : value.dump();
  }
  return metadata;
}

}  // namespace

StatusOr<std::unique_ptr<ShardedCheckpoint>> ShardedCheckpoint::Open(const std::string& dir,
                                                                     Reading reading) {
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec)) {
    return NotFoundError(dir + " is not a directory");
  }
  const std::string single = (std::filesystem::path(dir) / "model.safetensors").string();
  if (std::filesystem::exists(single, ec)) return OpenFile(single, reading);
  const std::string index = (std::filesystem::path(dir) / "model.safetensors.index.json").string();
  if (std::filesystem::exists(index, ec)) return OpenIndex(index, reading);
  return NotFoundError(dir + " has neither model.safetensors nor model.safetensors.index.json");
}

StatusOr<std::unique_ptr<ShardedCheckpoint>> ShardedCheckpoint::OpenFile(const std::string& path,
                                                                         Reading reading) {
  std::unique_ptr<ShardedCheckpoint> ckpt(new ShardedCheckpoint());
  ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsFile> file, SafetensorsFile::Open(path, reading));
  for (const TensorView& t : file->tensors()) ckpt->by_name_.emplace(t.name, &t);
  ckpt->metadata_ = file->metadata();
  ckpt->shards_.push_back(std::move(file));
  for (const auto& [name, view] : ckpt->by_name_) ckpt->names_.push_back(name);
  return ckpt;
}

StatusOr<std::unique_ptr<ShardedCheckpoint>> ShardedCheckpoint::OpenIndex(
    const std::string& index_path, Reading reading) {
  ASSIGN_OR_RETURN(const std::string text, ReadFileToString(index_path, kMaxHeaderBytes));
  ASSIGN_OR_RETURN(const Json index, ParseJsonStrict(text, index_path));
  if (!index.is_object()) {
    return DataLossError(index_path + ": must be a JSON object, got " + JsonTypeName(index));
  }
  if (!index.contains("weight_map")) return DataLossError(index_path + ": missing 'weight_map'");
  const Json& weight_map = index["weight_map"];
  if (!weight_map.is_object()) {
    return DataLossError(index_path + ": 'weight_map' must be an object, got " +
                         JsonTypeName(weight_map));
  }
  if (weight_map.empty()) return DataLossError(index_path + ": 'weight_map' is empty");

  std::unique_ptr<ShardedCheckpoint> ckpt(new ShardedCheckpoint());
  ASSIGN_OR_RETURN(ckpt->metadata_, IndexMetadata(index_path, index));

  const std::filesystem::path dir = std::filesystem::path(index_path).parent_path();
  std::map<std::string, size_t> shard_index;  // shard file name → shards_ position
  for (const auto& [tensor, shard_json] : weight_map.items()) {
    const std::string context =
        index_path + ": tensor '" + OnOneLine(tensor, kMaxQuotedBytes) + "'";
    if (!shard_json.is_string()) {
      return DataLossError(context + ": shard must be a file name, got " +
                           JsonTypeName(shard_json));
    }
    const std::string& shard = shard_json.get_ref<const std::string&>();
    // Shards live beside the index; a path elsewhere is a broken or hostile index, not a layout we
    // know.
    if (shard.empty() || shard == "." || shard == ".." || shard.find('/') != std::string::npos ||
        shard.find('\\') != std::string::npos) {
      return DataLossError(context + ": shard '" + OnOneLine(shard, kMaxQuotedBytes) +
                           "' must be a plain file name in the index's directory");
    }
    auto it = shard_index.find(shard);
    if (it == shard_index.end()) {
      const std::string shard_path = (dir / shard).string();
      StatusOr<std::unique_ptr<SafetensorsFile>> file = SafetensorsFile::Open(shard_path, reading);
      if (!file.ok()) {
        if (file.status().code() == StatusCode::kNotFound) {
          return NotFoundError(context + ": shard file " + shard_path + " does not exist");
        }
        return file.status();
      }
      it = shard_index.emplace(shard, ckpt->shards_.size()).first;
      ckpt->shards_.push_back(std::move(*file));
    }
    const TensorView* view = ckpt->shards_[it->second]->Find(tensor);
    if (view == nullptr) {
      return DataLossError(context + " is listed in shard '" + OnOneLine(shard, kMaxQuotedBytes) +
                           "' but that file has no such tensor");
    }
    ckpt->by_name_.emplace(tensor, view);
  }
  for (const auto& [name, view] : ckpt->by_name_) ckpt->names_.push_back(name);
  return ckpt;
}

const TensorView* ShardedCheckpoint::Find(std::string_view name) const {
  const auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : it->second;
}

}  // namespace llmctl::safetensors
