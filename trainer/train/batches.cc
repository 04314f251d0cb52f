#include "trainer/train/batches.h"

#include <cstdlib>
#include <filesystem>
#include <iomanip>
#include <sstream>

#include "common/data/batch_iterator.h"
#include "common/data/file_util.h"
#include "common/data/text_encoder.h"
#include "common/data/token_file.h"
#include "common/inputs/trial_inputs.h"
#include "common/tokenizer/tokenizer.h"

namespace llmctl::trainer {
namespace {

namespace fs = std::filesystem;

class TokenFileBatches final : public BatchSource {
 public:
  TokenFileBatches(std::unique_ptr<data::TokenFile> file, data::BatchIterator iterator)
      : file_(std::move(file)), iterator_(std::move(iterator)) {}

  int64_t num_examples() const override { return file_->num_examples(); }

  MicroBatch Next(int64_t size, torch::Device device) override {
    data::Batch batch = iterator_.Next();
    TORCH_CHECK(batch.rows == size, "micro-batch of ", batch.rows, " rows, expected ", size);
    MicroBatch micro;
    const auto options = torch::TensorOptions().dtype(torch::kInt64);
    // (B, T) each; copied out of the vectors, then moved to the device.
    micro.input_ids = torch::from_blob(batch.input_ids.data(), {batch.rows, batch.seq_len}, options)
                          .clone()
                          .to(device);
    micro.labels = torch::from_blob(batch.labels.data(), {batch.rows, batch.seq_len}, options)
                       .clone()
                       .to(device);
    const torch::Tensor lengths =
        torch::from_blob(batch.lengths.data(), {batch.rows, 1}, options).clone();
    micro.attention_mask =
        (torch::arange(batch.seq_len, options).unsqueeze(0) < lengths).to(device);
    micro.label_tokens = batch.num_target_tokens;
    for (int64_t length : batch.lengths) micro.real_tokens += length;
    micro.example_indices = std::move(batch.example_indices);
    return micro;
  }

  nlohmann::json Position() const override {
    const data::BatchPosition position = iterator_.position();
    return {{"epoch", position.epoch}, {"index", position.index}};
  }

  Status Restore(const nlohmann::json& position) override {
    const auto count = [&position](const char* key) {
      const auto found = position.find(key);
      return found != position.end() && found->is_number_integer() && found->get<int64_t>() >= 0;
    };
    if (!position.is_object() || !count("epoch") || !count("index")) {
      return DataLossError("data position must be {\"epoch\": N, \"index\": N}");
    }
    return iterator_.Restore({position["epoch"].get<int64_t>(), position["index"].get<int64_t>()});
  }

 private:
  std::unique_ptr<data::TokenFile> file_;
  data::BatchIterator iterator_;
};

}  // namespace

StatusOr<std::unique_ptr<BatchSource>> OpenTokenFileBatches(const std::string& token_path,
                                                            const TrialConfig& config,
                                                            int64_t vocab_size, int32_t pad_id,
                                                            int rank, int world_size) {
  ASSIGN_OR_RETURN(std::unique_ptr<data::TokenFile> file, data::TokenFile::Open(token_path));
  if (file->max_token_id() >= vocab_size) {
    return InvalidArgumentError(token_path + ": token id " + std::to_string(file->max_token_id()) +
                                " is outside the model's vocabulary of " +
                                std::to_string(vocab_size));
  }
  // The header's BOS and EOS ids (EOS pads the batches) are outside its content hash.
  for (const auto& [what, id] : {std::pair{"bos_id", file->bos_id()}, {"eos_id", file->eos_id()}}) {
    if (id < -1 || id >= vocab_size) {
      return InvalidArgumentError(token_path + ": " + what + " " + std::to_string(id) +
                                  " is outside the model's vocabulary of " +
                                  std::to_string(vocab_size));
    }
  }
  data::BatchOptions options = data::BatchOptionsFor(config.settings().train, rank, world_size);
  options.pad_id = pad_id;
  RETURN_IF_ERROR(
      data::CheckOneMicroBatchPerRank(config.settings(), file->num_examples(), world_size));
  ASSIGN_OR_RETURN(data::BatchIterator iterator, data::BatchIterator::Create(*file, options));
  return std::unique_ptr<BatchSource>(new TokenFileBatches(std::move(file), std::move(iterator)));
}

StatusOr<std::unique_ptr<BatchSource>> OpenBatches(const TrialConfig& config, int64_t vocab_size,
                                                   int rank, int world_size) {
  ASSIGN_OR_RETURN(std::string path, PrepareTokens(config));
  return OpenTokenFileBatches(path, config, vocab_size, /*pad_id=*/-1, rank, world_size);
}

}  // namespace llmctl::trainer
