// PIL's Image.resize(size, Image.BICUBIC) on 8-bit RGB, bit for bit (libImaging/Resample.c): a
// separable convolution, horizontal pass then vertical, each over the bicubic kernel (a = -0.5)
// widened by the scale when shrinking (so downscaling is antialiased), with the weights in
// fixed point (22 fraction bits) and each pass rounded to 8 bits. Then the pixel values a
// CLIP-style image processor (Hugging Face's BlipImageProcessor, which Blip2Processor uses) makes:
// rescaled by 1/255 and normalised per channel.
#ifndef LLMCTL_COMMON_IMAGE_RESAMPLE_H_
#define LLMCTL_COMMON_IMAGE_RESAMPLE_H_

#include <array>
#include <vector>

#include "common/image/image.h"

namespace llmctl::image {

// `width` and `height` are positive.
RgbImage ResizeBicubic(const RgbImage& image, int width, int height);

// OpenAI CLIP's mean and standard deviation, BLIP-2's image processor's.
inline constexpr std::array<float, 3> kClipMean = {0.48145466f, 0.4578275f, 0.40821073f};
inline constexpr std::array<float, 3> kClipStd = {0.26862954f, 0.26130258f, 0.27577711f};

// (3, H, W) float32, channel-first: float32(v * (1 / 255), computed in double) - mean) / std, in
// float32, as transformers' rescale and normalize compute it on a numpy array.
std::vector<float> NormalizedPixels(const RgbImage& image, const std::array<float, 3>& mean,
                                    const std::array<float, 3>& std);

}  // namespace llmctl::image

#endif  // LLMCTL_COMMON_IMAGE_RESAMPLE_H_
