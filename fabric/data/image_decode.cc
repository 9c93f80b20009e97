#include "fabric/data/image_decode.h"

#include <csetjmp>
#include <cstdio>
#include <cstring>
#include <vector>

// jpeglib.h needs size_t and FILE declared first.
#include <jerror.h>
#include <jpeglib.h>
#include <png.h>
#include <torch/types.h>

#include "fabric/core/error.h"

namespace fabric {
namespace {

void check_pixels(int64_t width, int64_t height, const std::string& name, int64_t max_pixels) {
  if (width <= 0 || height <= 0) throw Error(name + ": the header gives no image size");
  if (width * height > max_pixels) {
    throw Error(name + ": image is " + std::to_string(width) + "x" + std::to_string(height) +
                " = " + std::to_string(width * height) + " pixels, above the limit of " +
                std::to_string(max_pixels) + " (data.max_image_pixels)");
  }
}

// libjpeg reports errors through error_exit, which must not return: it jumps back to decode's
// setjmp. Warnings go through emit_message(-1); a premature end of data is made an error (PIL's
// "image file is truncated"), other recoverable corruption is tolerated as PIL tolerates it.
struct JpegError {
  jpeg_error_mgr base;
  std::jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
};

void jpeg_error_exit(j_common_ptr cinfo) {
  auto* e = reinterpret_cast<JpegError*>(cinfo->err);
  (*cinfo->err->format_message)(cinfo, e->message);
  std::longjmp(e->jump, 1);
}

void jpeg_emit(j_common_ptr cinfo, int level) {
  if (level == -1 && cinfo->err->msg_code == JWRN_JPEG_EOF) jpeg_error_exit(cinfo);
}

struct JpegResult {
  std::vector<uint8_t> pixels;
  int64_t width = 0, height = 0;
  bool cmyk = false;
};

// Plain data only between setjmp and longjmp (no destructors to skip): `out` is the caller's.
bool jpeg_decode(const char* data, size_t size, int64_t min_w, int64_t min_h, int64_t max_pixels,
                 bool header_only, JpegResult* out, JpegError* err, std::string* why,
                 const std::string& name) {
  jpeg_decompress_struct cinfo;
  cinfo.err = jpeg_std_error(&err->base);
  err->base.error_exit = jpeg_error_exit;
  err->base.emit_message = jpeg_emit;
  err->message[0] = '\0';
  if (setjmp(err->jump)) {
    jpeg_destroy_decompress(&cinfo);
    *why = err->message;
    return false;
  }
  jpeg_create_decompress(&cinfo);
  jpeg_mem_src(&cinfo, reinterpret_cast<const unsigned char*>(data), size);
  jpeg_read_header(&cinfo, TRUE);
  out->width = cinfo.image_width;
  out->height = cinfo.image_height;
  if (header_only || out->width <= 0 || out->height <= 0 || out->width * out->height > max_pixels) {
    jpeg_destroy_decompress(&cinfo);
    return true;  // the caller checks the size
  }
  out->cmyk = cinfo.jpeg_color_space == JCS_CMYK || cinfo.jpeg_color_space == JCS_YCCK;
  cinfo.out_color_space = out->cmyk ? JCS_CMYK : JCS_RGB;
  cinfo.scale_num = 1;
  cinfo.scale_denom = 1;
  for (unsigned denom : {8u, 4u, 2u}) {
    const int64_t w = (out->width + denom - 1) / denom, h = (out->height + denom - 1) / denom;
    if (min_w > 0 && min_h > 0 && w >= min_w && h >= min_h) {
      cinfo.scale_denom = denom;
      break;
    }
  }
  cinfo.dct_method = JDCT_ISLOW;  // PIL's default: exact, the same pixels on every CPU
  jpeg_start_decompress(&cinfo);
  const size_t stride = static_cast<size_t>(cinfo.output_width) * cinfo.output_components;
  out->pixels.resize(stride * cinfo.output_height);
  while (cinfo.output_scanline < cinfo.output_height) {
    JSAMPROW row = out->pixels.data() + stride * cinfo.output_scanline;
    jpeg_read_scanlines(&cinfo, &row, 1);
  }
  out->width = cinfo.output_width;
  out->height = cinfo.output_height;
  jpeg_finish_decompress(&cinfo);
  jpeg_destroy_decompress(&cinfo);
  (void)name;
  return true;
}

torch::Tensor decode_jpeg(const char* data, size_t size, const std::string& name, int64_t min_w,
                          int64_t min_h, int64_t max_pixels) {
  JpegResult result;
  JpegError err;
  std::string why;
  if (!jpeg_decode(data, size, min_w, min_h, max_pixels, false, &result, &err, &why, name))
    throw Error(name + ": corrupt JPEG (" + one_line(why, 120) + ")");
  check_pixels(result.width, result.height, name, max_pixels);
  if (!result.cmyk) {
    return torch::from_blob(result.pixels.data(), {result.height, result.width, 3}, torch::kUInt8)
        .clone();
  }
  // Adobe CMYK stores inverted ink values: R = C·K / 255 (likewise G with M, B with Y).
  auto cmyk =
      torch::from_blob(result.pixels.data(), {result.height, result.width, 4}, torch::kUInt8)
          .to(torch::kInt32);
  auto k = cmyk.narrow(2, 3, 1);
  return (cmyk.narrow(2, 0, 3) * k / 255).to(torch::kUInt8).contiguous();
}

torch::Tensor decode_png(const char* data, size_t size, const std::string& name,
                         int64_t max_pixels) {
  png_image image;
  std::memset(&image, 0, sizeof(image));
  image.version = PNG_IMAGE_VERSION;
  if (!png_image_begin_read_from_memory(&image, data, size))
    throw Error(name + ": corrupt PNG (" + one_line(image.message, 120) + ")");
  const int64_t width = image.width, height = image.height;
  if (width <= 0 || height <= 0 || width * height > max_pixels) {
    png_image_free(&image);
    check_pixels(width, height, name, max_pixels);
  }
  image.format = PNG_FORMAT_RGBA;  // then the alpha is dropped, as PIL's convert("RGB") does
  auto rgba = torch::empty({height, width, 4}, torch::kUInt8);
  if (!png_image_finish_read(&image, nullptr, rgba.data_ptr(), 0, nullptr)) {
    const std::string message = image.message;
    png_image_free(&image);
    throw Error(name + ": corrupt PNG (" + one_line(message, 120) + ")");
  }
  return rgba.narrow(2, 0, 3).contiguous();
}

}  // namespace

ImageFormat sniff_image(const char* data, size_t size) {
  const auto* b = reinterpret_cast<const unsigned char*>(data);
  if (size >= 3 && b[0] == 0xFF && b[1] == 0xD8 && b[2] == 0xFF) return ImageFormat::kJpeg;
  if (size >= 8 && std::memcmp(data, "\x89PNG\r\n\x1a\n", 8) == 0) return ImageFormat::kPng;
  return ImageFormat::kUnknown;
}

ImageSize read_image_size(const char* data, size_t size, const std::string& name,
                          int64_t max_pixels) {
  switch (sniff_image(data, size)) {
    case ImageFormat::kJpeg: {
      JpegResult result;
      JpegError err;
      std::string why;
      if (!jpeg_decode(data, size, 0, 0, max_pixels, true, &result, &err, &why, name))
        throw Error(name + ": corrupt JPEG (" + one_line(why, 120) + ")");
      check_pixels(result.width, result.height, name, max_pixels);
      return {result.width, result.height};
    }
    case ImageFormat::kPng: {
      png_image image;
      std::memset(&image, 0, sizeof(image));
      image.version = PNG_IMAGE_VERSION;
      if (!png_image_begin_read_from_memory(&image, data, size))
        throw Error(name + ": corrupt PNG (" + one_line(image.message, 120) + ")");
      const ImageSize s{image.width, image.height};
      png_image_free(&image);
      check_pixels(s.width, s.height, name, max_pixels);
      return s;
    }
    case ImageFormat::kUnknown:
      break;
  }
  throw Error(name + ": not a JPEG or PNG image");
}

torch::Tensor decode_image(const char* data, size_t size, const std::string& name,
                           int64_t min_width, int64_t min_height, int64_t max_pixels) {
  switch (sniff_image(data, size)) {
    case ImageFormat::kJpeg:
      return decode_jpeg(data, size, name, min_width, min_height, max_pixels);
    case ImageFormat::kPng:
      return decode_png(data, size, name, max_pixels);
    case ImageFormat::kUnknown:
      break;
  }
  throw Error(name + ": not a JPEG or PNG image");
}

}  // namespace fabric
