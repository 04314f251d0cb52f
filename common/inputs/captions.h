// A BLIP-2 trial's language-model rows, as llm-train lays them out from an imagefolder caption set
// (trainer/train/caption_batches.cc builds its token file with CaptionExample), without LibTorch:
// `llmctl estimate` reads the longest row of a local caption set, since llm-train pads every
// micro-batch to its longest row.
#ifndef LLMCTL_COMMON_INPUTS_CAPTIONS_H_
#define LLMCTL_COMMON_INPUTS_CAPTIONS_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/blip2_config.h"
#include "common/data/dataset.h"
#include "common/data/text_encoder.h"
#include "common/image/imagefolder.h"
#include "common/inputs/token_cache.h"
#include "common/status.h"
#include "common/trial_config.h"

namespace llmctl {

// One caption's row: the image placeholder num_query_tokens times, then the caption's ids as the
// model's tokenizer frames them (OPT's: BOS first; T5's: EOS last), cut to `max_length` with the
// frame kept, as the tokenizer's truncation does; labels -100 on the placeholders. InvalidArgument
// naming the image when the caption holds the placeholder token.
StatusOr<data::TokenizedExample> CaptionExample(const data::TextEncoder& encoder,
                                                const image::CaptionedImage& entry,
                                                const Blip2Config& model, int64_t max_length,
                                                const std::string& folder);

// The token file of `images`' rows (CaptionExample each, in order) at `path`, its header carrying
// `fingerprint`: PrepareCaptionTokens's writing, with any encoder. Each row goes to a
// TokenFileWriter as it is made, so only its offset is held. Refused first when `path`'s directory
// lacks room (data::CheckRoomToPrepare) for rows of the queries and max_length tokens. Errors name
// the image or the file; on any, `path` is as it was.
Status WriteCaptionTokens(const data::TextEncoder& encoder,
                          const std::vector<image::CaptionedImage>& images,
                          const Blip2Config& model, int64_t max_length, const std::string& folder,
                          std::string_view fingerprint, const std::string& path);

// `config`'s captioned images as llm-train trains on them: data.path's imagefolder (captions from
// data.caption_column), its first data.samples when that is set. Errors name the file.
StatusOr<std::vector<image::CaptionedImage>> ReadTrialImages(const TrialConfig& config);

// The token cache's file of `images`' rows (CaptionExample each, in order, at data.max_seq_length)
// with the trial's tokenizer, written unless it is there: what llm-train draws `config`'s
// micro-batches from (trainer/train/caption_batches.cc) and `llmctl estimate` draws them as it
// will (common/inputs/drawn_batches.h). Errors name the file.
StatusOr<std::string> PrepareCaptionTokens(const TrialConfig& config, const Blip2Config& model,
                                           const std::vector<image::CaptionedImage>& images);
// The same through CachedOrTemporaryTokenFile: a cache that cannot be used is no error.
StatusOr<TokenFileRef> PrepareCaptionTokensToRead(const TrialConfig& config,
                                                  const Blip2Config& model,
                                                  const std::vector<image::CaptionedImage>& images);

// The fewest and the most caption tokens (the frame included, at most data.max_seq_length) of the
// rows of `config`'s caption set (data.path, a local imagefolder; data.samples applied), read with
// the trial's tokenizer. Errors name the file, as the trainer's reading of it does.
struct CaptionTokenSpan {
  int64_t shortest = 0;
  int64_t longest = 0;
};
StatusOr<CaptionTokenSpan> CaptionTokens(const TrialConfig& config, const Blip2Config& model);
// The same over `images`, the set as ReadTrialImages read it.
StatusOr<CaptionTokenSpan> CaptionTokens(const TrialConfig& config, const Blip2Config& model,
                                         const std::vector<image::CaptionedImage>& images);

// The source pixels an image of `config`'s caption set (as ReadTrialImages reads it) has on
// average, by format: the JPEGs' pixels over every image, and the PNGs'. From the headers of at
// most kSampledImages images spread evenly over the set. Errors name the file.
inline constexpr size_t kSampledImages = 256;
struct ImagePixels {
  double jpeg = 0;
  double png = 0;
};
StatusOr<ImagePixels> MeanImagePixels(const TrialConfig& config);
// The same over `images`, the set as ReadTrialImages read it.
StatusOr<ImagePixels> MeanImagePixels(const TrialConfig& config,
                                      const std::vector<image::CaptionedImage>& images);

// CaptionTokens' longest: llm-train pads a micro-batch to its longest row.
StatusOr<int64_t> LongestCaptionTokens(const TrialConfig& config, const Blip2Config& model);

}  // namespace llmctl

#endif  // LLMCTL_COMMON_INPUTS_CAPTIONS_H_
