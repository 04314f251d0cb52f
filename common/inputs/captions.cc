#include "common/inputs/captions.h"

#include <algorithm>
#include <memory>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "common/checked_math.h"
#include "common/data/file_util.h"
#include "common/data/token_file.h"
#include "common/image/image.h"
#include "common/inputs/token_cache.h"
#include "common/inputs/trial_inputs.h"
#include "common/tokenizer/tokenizer.h"

namespace llmctl {

StatusOr<data::TokenizedExample> CaptionExample(const data::TextEncoder& encoder,
                                                const image::CaptionedImage& entry,
                                                const Blip2Config& model, int64_t max_length,
                                                const std::string& folder) {
  ASSIGN_OR_RETURN(std::vector<int32_t> ids, encoder.Encode(entry.caption, false));
  const bool eos_last = model.t5() != nullptr && encoder.eos_id() >= 0;
  const bool bos_first = model.t5() == nullptr && encoder.bos_id() >= 0;
  const int64_t room = max_length - (eos_last ? 1 : 0) - (bos_first ? 1 : 0);
  data::TokenizedExample example;
  if (static_cast<int64_t>(ids.size()) > room) {
    ids.resize(static_cast<size_t>(std::max<int64_t>(room, 0)));
    example.truncated = true;
  }
  if (bos_first) ids.insert(ids.begin(), encoder.bos_id());
  if (eos_last) ids.push_back(encoder.eos_id());
  for (int32_t id : ids) {
    if (id == model.image_token_index) {
      return InvalidArgumentError(
          folder + "/" + entry.file_name + ": the caption holds the image placeholder token (id " +
          std::to_string(id) + "), which would take one of the image's positions");
    }
  }
  example.input_ids.assign(static_cast<size_t>(model.num_query_tokens),
                           static_cast<int32_t>(model.image_token_index));
  example.labels.assign(static_cast<size_t>(model.num_query_tokens), data::kIgnoreIndex);
  example.input_ids.insert(example.input_ids.end(), ids.begin(), ids.end());
  example.labels.insert(example.labels.end(), ids.begin(), ids.end());
  return example;
}

StatusOr<std::vector<image::CaptionedImage>> ReadTrialImages(const TrialConfig& config) {
  const DataSettings& data = config.settings().data;
  const std::string& folder = data.path;
  ASSIGN_OR_RETURN(std::vector<image::CaptionedImage> images,
                   image::ReadImageFolder(folder, folder, data.caption_column));
  const int64_t samples = data.samples;
  if (samples > 0 && static_cast<size_t>(samples) < images.size()) {
    images.resize(static_cast<size_t>(samples));
  }
  return images;
}

StatusOr<ImagePixels> MeanImagePixels(const TrialConfig& config) {
  ASSIGN_OR_RETURN(const std::vector<image::CaptionedImage> images, ReadTrialImages(config));
  return MeanImagePixels(config, images);
}

StatusOr<ImagePixels> MeanImagePixels(const TrialConfig& config,
                                      const std::vector<image::CaptionedImage>& images) {
  const size_t sampled = std::min(images.size(), kSampledImages);
  ImagePixels mean;
  for (size_t i = 0; i < sampled; ++i) {
    const image::CaptionedImage& entry = images[i * images.size() / sampled];
    ASSIGN_OR_RETURN(
        const image::ImageHeader header,
        image::ReadImageHeader(entry.path, config.settings().data.path + "/" + entry.file_name));
    const double pixels = static_cast<double>(header.width) * header.height;
    (header.format == image::ImageFormat::kJpeg ? mean.jpeg : mean.png) += pixels;
  }
  if (sampled > 0) {
    mean.jpeg /= static_cast<double>(sampled);
    mean.png /= static_cast<double>(sampled);
  }
  return mean;
}

namespace {

// PrepareCaptionTokens's work, the file placed by `place` (CachedTokenFile or
// CachedOrTemporaryTokenFile).
template <typename Place>
auto PrepareCaptionTokensWith(const TrialConfig& config, const Blip2Config& model,
                              const std::vector<image::CaptionedImage>& images, const Place& place)
    -> decltype(place(std::string(), std::function<Status(const std::string&)>())) {
  const DataSettings& data = config.settings().data;
  const int64_t max_length = data.max_seq_length;
  ASSIGN_OR_RETURN(std::unique_ptr<data::TextEncoder> encoder, LoadTrialTokenizer(config));
  // What the token file holds follows from the captions in order, the tokenizer and the layout.
  std::string captions;
  for (const image::CaptionedImage& entry : images) {
    captions += entry.file_name + '\0' + entry.caption + '\0';
  }
  std::ostringstream fingerprint;
  fingerprint << "llmctl-captions v1; tokenizer=" << encoder->fingerprint()
              << "; captions=fnv1a64:" << std::hex << data::Fnv1a64(captions) << std::dec
              << "; max_seq_length=" << max_length << "; frame=" << (model.t5() ? "eos" : "bos")
              << "; image_token=" << model.image_token_index << " x " << model.num_query_tokens;
  return place(fingerprint.str(), [&](const std::string& path) {
    return WriteCaptionTokens(*encoder, images, model, max_length, data.path, fingerprint.str(),
                              path);
  });
}

}  // namespace

Status WriteCaptionTokens(const data::TextEncoder& encoder,
                          const std::vector<image::CaptionedImage>& images,
                          const Blip2Config& model, int64_t max_length, const std::string& folder,
                          std::string_view fingerprint, const std::string& path) {
  // A row is at most the queries and max_length caption tokens (5 file bytes each) and its offset.
  const int64_t row_bytes =
      SaturatingAdd<int64_t>(SaturatingMul<int64_t>(model.num_query_tokens + max_length, 5), 8);
  RETURN_IF_ERROR(data::CheckRoomToPrepare(
      path, SaturatingMul(static_cast<int64_t>(images.size()), row_bytes)));
  ASSIGN_OR_RETURN(data::TokenFileWriter writer, data::TokenFileWriter::Create(path));
  for (const image::CaptionedImage& entry : images) {
    ASSIGN_OR_RETURN(const data::TokenizedExample example,
                     CaptionExample(encoder, entry, model, max_length, folder));
    RETURN_IF_ERROR(writer.Add(example));
  }
  return writer.Finish(fingerprint, encoder.bos_id(), encoder.eos_id());
}

StatusOr<std::string> PrepareCaptionTokens(const TrialConfig& config, const Blip2Config& model,
                                           const std::vector<image::CaptionedImage>& images) {
  return PrepareCaptionTokensWith(config, model, images, CachedTokenFile);
}

StatusOr<TokenFileRef> PrepareCaptionTokensToRead(
    const TrialConfig& config, const Blip2Config& model,
    const std::vector<image::CaptionedImage>& images) {
  return PrepareCaptionTokensWith(config, model, images, CachedOrTemporaryTokenFile);
}

StatusOr<CaptionTokenSpan> CaptionTokens(const TrialConfig& config, const Blip2Config& model) {
  ASSIGN_OR_RETURN(const std::vector<image::CaptionedImage> images, ReadTrialImages(config));
  return CaptionTokens(config, model, images);
}

StatusOr<CaptionTokenSpan> CaptionTokens(const TrialConfig& config, const Blip2Config& model,
                                         const std::vector<image::CaptionedImage>& images) {
  const DataSettings& data = config.settings().data;
  const std::string& folder = data.path;
  ASSIGN_OR_RETURN(const std::string path, TrialTokenizerPath(config));
  ASSIGN_OR_RETURN(Tokenizer tokenizer, Tokenizer::Load(path));
  // The fingerprint names a token file, which nothing here writes.
  const data::TokenizerTextEncoder<Tokenizer> encoder(tokenizer, "");
  const int64_t max_length = data.max_seq_length;
  CaptionTokenSpan span{.shortest = max_length, .longest = 0};
  for (const image::CaptionedImage& entry : images) {
    ASSIGN_OR_RETURN(const data::TokenizedExample example,
                     CaptionExample(encoder, entry, model, max_length, folder));
    const int64_t tokens = static_cast<int64_t>(example.input_ids.size()) - model.num_query_tokens;
    span.shortest = std::min(span.shortest, tokens);
    span.longest = std::max(span.longest, tokens);
  }
  return span;
}

StatusOr<int64_t> LongestCaptionTokens(const TrialConfig& config, const Blip2Config& model) {
  ASSIGN_OR_RETURN(const CaptionTokenSpan span, CaptionTokens(config, model));
  return span.longest;
}

}  // namespace llmctl
