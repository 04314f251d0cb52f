#include "common/inputs/captions.h"

#include <algorithm>
#include <utility>
#include <vector>

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

StatusOr<CaptionTokenSpan> CaptionTokens(const TrialConfig& config, const Blip2Config& model) {
  const DataSettings& data = config.settings().data;
  const std::string& folder = data.path;
  ASSIGN_OR_RETURN(std::vector<image::CaptionedImage> images, ReadTrialImages(config));
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
