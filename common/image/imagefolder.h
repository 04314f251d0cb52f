// Hugging Face's imagefolder layout for image-caption data, as people lay out a set like the lab's
// gourmetgram captions: a folder of images beside metadata.jsonl (one JSON object per line) or
// metadata.csv (RFC 4180, a header row), each row naming its image in `file_name` (relative to the
// folder) and holding its caption in a caption column.
#ifndef LLMCTL_COMMON_IMAGE_IMAGEFOLDER_H_
#define LLMCTL_COMMON_IMAGE_IMAGEFOLDER_H_

#include <string>
#include <vector>

#include "common/status.h"

namespace llmctl::image {

struct CaptionedImage {
  std::string file_name;  // as the metadata wrote it, relative to the folder
  std::string path;       // folder / file_name
  std::string caption;
};

// Reads `folder`'s metadata (metadata.jsonl, else metadata.csv; both is an error, as for the
// datasets library): UTF-8, a leading byte-order mark skipped. Every row must name a file inside the folder that exists and hold a non-empty
// string caption in `caption_column`. Errors are InvalidArgument naming `display_folder`'s metadata
// file, the line and what is wrong (NotFound when there is no metadata). Images are not decoded
// here: CheckImages does that.
StatusOr<std::vector<CaptionedImage>> ReadImageFolder(const std::string& folder,
                                                      const std::string& display_folder,
                                                      const std::string& caption_column);

// Decodes every image (image.h's DecodeImageFile), so a broken one is refused before a run with its
// name: the first error, naming `display_folder`/file_name.
Status CheckImages(const std::vector<CaptionedImage>& images, const std::string& display_folder);

}  // namespace llmctl::image

#endif  // LLMCTL_COMMON_IMAGE_IMAGEFOLDER_H_
