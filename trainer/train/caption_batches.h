// BLIP-2's micro-batches: images and their captions from an imagefolder (common/image), as the labs'
// fine-tuning script feeds Blip2ForConditionalGeneration. Each row is
//   input_ids: the image placeholder num_query_tokens times (as Blip2Processor prepends it), then the
//              tokenizer's ids of the caption (OPT's: BOS first; T5's: EOS last), cut to
//              data.max_seq_length as the labs' tokenizer call cuts at max_length, right-padded with
//              the language model's pad id;
//   labels:    the ids, -100 on the placeholders and the padding: OPT's loss is the captions'
//              shifted cross-entropy, the query positions ignored; T5's decoder predicts the
//              caption's columns (Blip2ForConditionalGeneration::Loss);
//   attention_mask: false on the padding (T5's encoder attends both ways);
//   pixel_values: the image decoded, resized to the vision encoder's size with PIL's bicubic and
//              normalised with CLIP's mean and std, bit for bit Blip2Processor's.
// The captions are tokenized once into the token cache (as text data is); images are decoded for
// each micro-batch.
#ifndef LLMCTL_TRAINER_TRAIN_CAPTION_BATCHES_H_
#define LLMCTL_TRAINER_TRAIN_CAPTION_BATCHES_H_

#include <memory>

#include "common/blip2_config.h"
#include "common/status.h"
#include "common/trial_config.h"
#include "trainer/train/batches.h"

namespace llmctl::trainer {

// The trial's imagefolder (data.path, data.caption_column, data.samples) as micro-batches for
// `model`, shuffled with the seed; as rank `rank` of `world_size`, its shard of every epoch. Errors
// name the metadata file and line (a caption holding the placeholder token's text, which would
// shift the image's rows), or the image that does not decode.
StatusOr<std::unique_ptr<BatchSource>> OpenCaptionBatches(const TrialConfig& config,
                                                          const Blip2Config& model, int rank,
                                                          int world_size);

}  // namespace llmctl::trainer

#endif  // LLMCTL_TRAINER_TRAIN_CAPTION_BATCHES_H_
