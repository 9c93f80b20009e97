// Decoding JPEG (libjpeg-turbo) and PNG (libpng) files into RGB uint8 tensors [H, W, 3].
//
// What PIL's Image.open(f).convert("RGB") gives, with these rules: grayscale is replicated to three
// channels; a PNG's alpha channel is dropped (not composited); palette PNGs are expanded; 16-bit
// PNGs are reduced to 8 bits by libpng's simplified API; CMYK and YCCK JPEGs (Adobe, inverted
// ink values) become R = C·K/255 and so on. A JPEG may be decoded at 1/2, 1/4 or 1/8 of its size
// (DCT scaling, as PIL's draft mode) when the caller says how small it may get.
//
// Errors (fabric::Error "NAME: ..."): not a JPEG or PNG (sniffed from the bytes, not the file
// name), a truncated or corrupt file (a JPEG ending early is an error, not a gray tail), and an
// image with more pixels than `max_pixels` (checked from the header, before any allocation).
// Safe to call from several threads at once.
#ifndef FABRIC_DATA_IMAGE_DECODE_H_
#define FABRIC_DATA_IMAGE_DECODE_H_

#include <torch/types.h>

#include <cstddef>
#include <cstdint>
#include <string>

namespace fabric {

enum class ImageFormat { kUnknown, kJpeg, kPng };

// From the first bytes (magic numbers).
ImageFormat sniff_image(const char* data, size_t size);

struct ImageSize {
  int64_t width = 0, height = 0;
};

// PIL's Image.MAX_IMAGE_PIXELS, the limit torchvision's loaders inherit.
inline constexpr int64_t kDefaultMaxImagePixels = 89478485;

// The size in the header, without decoding. Throws fabric::Error naming `name`.
ImageSize read_image_size(const char* data, size_t size, const std::string& name,
                          int64_t max_pixels = kDefaultMaxImagePixels);

// Decodes to uint8 [H, W, 3]. A JPEG is decoded at the smallest DCT scale (1, 1/2, 1/4, 1/8) whose
// size stays at least min_width x min_height (0: full size). Throws fabric::Error naming `name`.
torch::Tensor decode_image(const char* data, size_t size, const std::string& name,
                           int64_t min_width = 0, int64_t min_height = 0,
                           int64_t max_pixels = kDefaultMaxImagePixels);

}  // namespace fabric

#endif  // FABRIC_DATA_IMAGE_DECODE_H_
