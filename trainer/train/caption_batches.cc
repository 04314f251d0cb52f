#include "trainer/train/caption_batches.h"

#include <utility>
#include <vector>

#include "common/image/image.h"
#include "common/image/imagefolder.h"
#include "common/image/resample.h"
#include "common/inputs/captions.h"

namespace llmctl::trainer {
namespace {

// The text rows come from a token-file source; this adds each row's image.
class CaptionBatches final : public BatchSource {
 public:
  CaptionBatches(std::unique_ptr<BatchSource> text, std::vector<image::CaptionedImage> images,
                 std::string folder, int64_t image_size)
      : text_(std::move(text)),
        images_(std::move(images)),
        folder_(std::move(folder)),
        image_size_(image_size) {}

  int64_t num_examples() const override { return text_->num_examples(); }

  MicroBatch Next(int64_t size, torch::Device device) override {
    MicroBatch batch = text_->Next(size, device);
    const int64_t rows = static_cast<int64_t>(batch.example_indices.size());
    const int64_t plane = 3 * image_size_ * image_size_;
    // (B, 3, S, S), filled row by row on the host, then moved to the device.
    torch::Tensor pixels = torch::empty({rows, 3, image_size_, image_size_}, torch::kFloat32);
    float* out = pixels.data_ptr<float>();
    for (int64_t row = 0; row < rows; ++row) {
      const image::CaptionedImage& entry =
          images_.at(static_cast<size_t>(batch.example_indices[row]));
      // Checked before the run (CheckImages); a file changed since fails the run here.
      StatusOr<image::RgbImage> decoded =
          image::DecodeImageFile(entry.path, folder_ + "/" + entry.file_name);
      if (!decoded.ok()) throw std::runtime_error(decoded.status().message());
      const int side = static_cast<int>(image_size_);
      const std::vector<float> values = image::NormalizedPixels(
          image::ResizeBicubic(*decoded, side, side), image::kClipMean, image::kClipStd);
      std::copy(values.begin(), values.end(), out + row * plane);
    }
    batch.pixel_values = pixels.to(device);
    return batch;
  }

  nlohmann::json Position() const override { return text_->Position(); }
  Status Restore(const nlohmann::json& position) override { return text_->Restore(position); }

 private:
  std::unique_ptr<BatchSource> text_;
  std::vector<image::CaptionedImage> images_;  // by example index
  std::string folder_;
  int64_t image_size_;
};

}  // namespace

StatusOr<std::unique_ptr<BatchSource>> OpenCaptionBatches(const TrialConfig& config,
                                                          const Blip2Config& model, int rank,
                                                          int world_size) {
  const DataSettings& data = config.settings().data;
  const std::string& folder = data.path;
  ASSIGN_OR_RETURN(std::vector<image::CaptionedImage> images, ReadTrialImages(config));
  const int64_t max_length = data.max_seq_length;
  // OPT's positions are learned, so bounded; T5's relative buckets take any length.
  if (const OptConfig* opt = model.opt();
      opt != nullptr && model.num_query_tokens + max_length > opt->max_position_embeddings) {
    return InvalidArgumentError("data.max_seq_length (" + std::to_string(max_length) +
                                ") and the image's " + std::to_string(model.num_query_tokens) +
                                " query positions exceed the language model's " +
                                std::to_string(opt->max_position_embeddings) + " positions");
  }

  ASSIGN_OR_RETURN(const std::string path, PrepareCaptionTokens(config, model, images));
  ASSIGN_OR_RETURN(
      std::unique_ptr<BatchSource> text,
      OpenTokenFileBatches(path, config, model.text_vocab_size(),
                           static_cast<int32_t>(model.text_pad_token_id()), rank, world_size));
  return std::unique_ptr<BatchSource>(
      new CaptionBatches(std::move(text), std::move(images), folder, model.vision.image_size));
}

}  // namespace llmctl::trainer
