#include "common/inputs/trial_inputs.h"

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>

#include "common/data/dataset.h"
#include "common/data/token_file.h"
#include "common/experiment.h"
#include "common/files.h"
#include "common/foreign_json.h"
#include "common/image/imagefolder.h"
#include "common/tokenizer/tokenizer.h"

namespace llmctl {
namespace {

namespace fs = std::filesystem;

// A directory input: it must exist and be a directory; anything else is named for what it is.
Status CheckDirectory(const std::string& dir) {
  std::error_code error;
  const fs::file_status status = fs::status(dir, error);
  if (error || !fs::exists(status)) return NotFoundError(dir + ": no such directory");
  if (!fs::is_directory(status)) return InvalidArgumentError(dir + " is not a directory");
  return Status::Ok();
}

}  // namespace

StatusOr<std::string> TrialTokenizerPath(const TrialConfig& config) {
  std::string path = config.settings().model.tokenizer;
  if (path.empty()) {
    const std::string& model = config.settings().model.name;
    std::error_code error;
    if (!fs::is_directory(model, error)) {
      return InvalidArgumentError("tokenizer: model '" + model +
                                  "' is a preset without files; set tokenizer to a tokenizer.json "
                                  "(experiments/tokenizers/demo/tokenizer.json is the demo's)");
    }
    path = model;
  }
  std::error_code error;
  if (fs::is_directory(path, error)) path = (fs::path(path) / "tokenizer.json").string();
  return path;
}

Status CheckCheckpointTensors(const safetensors::ShardedCheckpoint& checkpoint,
                              const ModelConfig& model, const std::string& source) {
  // transformers ignores these on load: a tied head saved anyway, and rotary tables it recomputes.
  const auto tolerated = [&](const std::string& name) {
    return (name == "lm_head.weight" && model.tie_word_embeddings) ||
           name.ends_with("rotary_emb.inv_freq");
  };
  size_t tolerated_present = 0;
  for (const std::string& name : checkpoint.names()) tolerated_present += tolerated(name) ? 1 : 0;
  const int64_t expected = CheckpointTensorCount(model);
  const auto present = static_cast<int64_t>(checkpoint.names().size() - tolerated_present);
  // Counted before the list is made, so that a config.json claiming a billion layers is not listed
  // out; short of that, the loop below names the first missing tensor, more use than a count.
  if (expected > present + 100000) {
    return DataLossError(source + ": the checkpoint has " + std::to_string(present) +
                         " tensors, config.json describes " + std::to_string(expected));
  }
  std::set<std::string, std::less<>> used;
  for (const CheckpointTensor& tensor : CheckpointTensors(model)) {
    const safetensors::TensorView* view = checkpoint.Find(tensor.name);
    if (view == nullptr) {
      return DataLossError(source + ": tensor '" + tensor.name +
                           "' is missing (is config.json the one that belongs to these weights?)");
    }
    if (view->shape != tensor.shape) {
      return DataLossError(source + ": tensor '" + tensor.name + "' has shape " +
                           safetensors::ShapeString(view->shape) + ", expected " +
                           safetensors::ShapeString(tensor.shape));
    }
    if (!safetensors::IsFloatingPoint(view->dtype)) {
      return DataLossError(source + ": tensor '" + tensor.name + "' has dtype " +
                           std::string(safetensors::DTypeName(view->dtype)) +
                           ", expected a floating-point type");
    }
    used.insert(tensor.name);
  }
  for (const std::string& name : checkpoint.names()) {
    if (used.contains(name) || tolerated(name)) continue;
    return DataLossError(source + ": unexpected tensor '" + name +
                         "' (is config.json the one that belongs to these weights?)");
  }
  return Status::Ok();
}

StatusOr<TrialInputsSummary> TrialInputsChecker::Check(const TrialConfig& config,
                                                       const ModelConfig* model) {
  TrialInputsSummary summary;
  const TrialSettings& settings = config.settings();
  const std::string& data_path = settings.data.path;
  if (!IsNodePath(data_path)) {
    StatusOr<int64_t> records = CheckData(config);
    if (!records.ok()) return records.status().WithContext("data.path");
    summary.records = *records;
  }

  const std::string& model_name = settings.model.name;
  const std::string& tokenizer = settings.model.tokenizer;
  // A tokenizer that comes from a model only the node has is the node's to read.
  const bool tokenizer_here =
      !IsNodePath(tokenizer) &&
      !(tokenizer.empty() && (IsNodePath(model_name) || IsHubModelRef(model_name)));
  if (tokenizer_here) {
    StatusOr<std::string> path = TrialTokenizerPath(config);
    if (!path.ok()) return path.status();
    StatusOr<int64_t> vocab = CheckTokenizer(*path);
    if (!vocab.ok()) return vocab.status().WithContext("tokenizer");
    if (model != nullptr && *vocab > model->vocab_size) {
      return InvalidArgumentError("tokenizer: " + *path + " has " + std::to_string(*vocab) +
                                  " tokens, more than the model's vocab_size " +
                                  std::to_string(model->vocab_size));
    }
    summary.tokenizer_path = *path;
    summary.tokenizer_vocab = *vocab;
  }

  const bool model_dir_here =
      FindPreset(model_name) == nullptr && !IsHubModelRef(model_name) && !IsNodePath(model_name);
  if (model_dir_here && model != nullptr && settings.model.init == trial::Init::kPretrained) {
    StatusOr<int64_t> tensors = CheckCheckpoint(model_name, *model);
    if (!tensors.ok()) return tensors.status().WithContext("model");
    summary.checkpoint_tensors = *tensors;
  }

  const std::string& adapter = settings.peft.adapter;
  if (!adapter.empty() && !IsNodePath(adapter)) {
    if (Status status = CheckAdapter(adapter); !status.ok()) {
      return status.WithContext("peft.adapter");
    }
  }
  return summary;
}

StatusOr<int64_t> TrialInputsChecker::CheckData(const TrialConfig& config) {
  const TrialSettings& settings = config.settings();
  const std::string& path = settings.data.path;
  if (path.empty()) return InvalidArgumentError("no dataset given");
  const int64_t samples = settings.data.samples;
  StatusOr<int64_t>* answer = nullptr;
  if (settings.data.format == trial::DataFormat::kImagefolder) {
    const std::string& column = settings.data.caption_column;
    auto [it, inserted] = done_.try_emplace(
        "images\n" + path + "\n" + column + "\n" + std::to_string(samples), int64_t{0});
    answer = &it->second;
    if (inserted) {
      it->second = [&]() -> StatusOr<int64_t> {
        ASSIGN_OR_RETURN(std::vector<image::CaptionedImage> images,
                         image::ReadImageFolder(path, path, column));
        if (samples > 0 && static_cast<size_t>(samples) < images.size()) {
          images.resize(static_cast<size_t>(samples));
        }
        // Every image the trial reads decodes: a broken one is refused now, not mid-run.
        RETURN_IF_ERROR(image::CheckImages(images, path));
        return static_cast<int64_t>(images.size());
      }();
    }
  } else {
    ASSIGN_OR_RETURN(const data::PrepareOptions options, data::PrepareOptionsFor(config));
    const std::string key = "data\n" + path + "\n" +
                            std::string(data::DatasetFormatName(options.format)) + "\n" +
                            std::string(data::PromptTemplateName(options.prompt_template)) + "\n" +
                            std::to_string(options.samples);
    auto [it, inserted] = done_.try_emplace(key, int64_t{0});
    answer = &it->second;
    if (inserted) {
      it->second = [&]() -> StatusOr<int64_t> {
        // Read a line at a time (a dataset may be larger than memory), each record the trial
        // reads rendered as training will: a template that does not fit the records fails here.
        int64_t records = 0;
        RETURN_IF_ERROR(
            data::ForEachJsonlRecord(path, options.format, [&](data::Record record) -> Status {
              ++records;
              if (options.samples > 0 && records > options.samples) return Status::Ok();
              StatusOr<data::PromptAndResponse> rendered =
                  data::RenderExample(record, options.format, options.prompt_template);
              if (!rendered.ok()) {
                return rendered.status().WithContext(path + ":" + std::to_string(record.line));
              }
              return Status::Ok();
            }));
        return options.samples > 0 ? std::min(records, options.samples) : records;
      }();
    }
  }
  ASSIGN_OR_RETURN(const int64_t records, *answer);
  const int64_t micro_batch = settings.train.micro_batch_size;
  if (records < micro_batch) {
    return InvalidArgumentError(path + " has " + std::to_string(records) +
                                " records, fewer than one micro-batch of " +
                                std::to_string(micro_batch));
  }
  return records;
}

StatusOr<int64_t> TrialInputsChecker::CheckTokenizer(const std::string& path) {
  auto [it, inserted] = done_.try_emplace("tokenizer\n" + path, int64_t{0});
  if (inserted) {
    StatusOr<Tokenizer> tokenizer = Tokenizer::Load(path);
    it->second = tokenizer.ok() ? StatusOr<int64_t>(tokenizer->vocab_size())
                                : StatusOr<int64_t>(tokenizer.status());
  }
  return it->second;
}

StatusOr<int64_t> TrialInputsChecker::CheckCheckpoint(const std::string& dir,
                                                      const ModelConfig& model) {
  auto [it, inserted] = done_.try_emplace("model\n" + dir, int64_t{0});
  if (inserted) {
    it->second = [&]() -> StatusOr<int64_t> {
      RETURN_IF_ERROR(CheckDirectory(dir));
      // Reads and validates the files' headers alone: no weight is read, and nothing is mapped, so
      // a file another process truncates meanwhile is an error, not a SIGBUS in llmctl.
      ASSIGN_OR_RETURN(auto checkpoint, safetensors::ShardedCheckpoint::Open(
                                            dir, safetensors::Reading::kHeaderOnly));
      RETURN_IF_ERROR(CheckCheckpointTensors(*checkpoint, model, dir));
      return static_cast<int64_t>(checkpoint->names().size());
    }();
  }
  return it->second;
}

Status TrialInputsChecker::CheckAdapter(const std::string& dir) {
  auto [it, inserted] = done_.try_emplace("adapter\n" + dir, int64_t{0});
  if (inserted) {
    it->second = [&]() -> StatusOr<int64_t> {
      RETURN_IF_ERROR(CheckDirectory(dir));
      const std::string config_path = dir + "/" + kAdapterConfigFile;
      ASSIGN_OR_RETURN(const std::string text,
                       ReadFileToString(config_path, kMaxAdapterConfigBytes));
      const nlohmann::json parsed = ParseForeignJson(text);
      if (parsed.is_discarded() || !parsed.is_object()) {
        return DataLossError(config_path + ": not a JSON object");
      }
      ASSIGN_OR_RETURN(auto weights,
                       safetensors::SafetensorsFile::Open(dir + "/" + kAdapterWeightsFile,
                                                          safetensors::Reading::kHeaderOnly));
      return static_cast<int64_t>(weights->tensors().size());
    }();
  }
  return it->second.status();
}

}  // namespace llmctl
