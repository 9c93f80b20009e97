// JPEG / PNG decoding and ImageFolderDataset (fabric/data/image_decode.h, image_folder.h) on files
// written by Pillow (the setup's Python): decoded pixels equal Pillow's Image.convert("RGB") for
// RGB, grayscale and CMYK JPEGs and RGB, RGBA, palette and grayscale PNGs; DCT-scaled decoding
// stays close to the full decode; folder and list layouts; random crops are reproducible from the
// batch generator; every bad input is one line naming the file, or with skip_bad_files a shorter
// batch and a count.
#include "fabric/data/image_folder.h"

#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <torch/nn/functional.h>

#include <filesystem>
#include <fstream>
#include <iterator>

#include "fabric/core/error.h"
#include "fabric/data/image_decode.h"
#include "fabric/data/npy.h"
#include "tests/run_command.h"

namespace fs = std::filesystem;

namespace {

class ImageFolderTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    std::string tmpl = (fs::path(::testing::TempDir()) / "images_XXXXXX").string();
    dir_ = mkdtemp(tmpl.data());
    // Images NAME.{jpg,png} and NAME.npy: what Pillow's convert("RGB") gives for them.
    const std::string program = R"(
import sys, os, numpy as np
from PIL import Image
d = sys.argv[1]
rng = np.random.default_rng(0)
def smooth(h, w, c):
    y, x = np.mgrid[0:h, 0:w]
    planes = [127 + 100 * np.sin(x / (5 + 3 * k) + y / (7 + k)) for k in range(c)]
    return np.clip(np.stack(planes, -1) + rng.normal(0, 8, (h, w, c)), 0, 255).astype(np.uint8)
def save(name, im, **kw):
    im.save(f'{d}/{name}', **kw)
    np.save(f'{d}/{name}.npy', np.asarray(Image.open(f'{d}/{name}').convert('RGB')))
save('rgb.jpg', Image.fromarray(smooth(37, 53, 3)), quality=92)
save('gray.jpg', Image.fromarray(smooth(40, 30, 1)[:, :, 0], 'L'), quality=92)
save('cmyk.jpg', Image.fromarray(smooth(24, 32, 4), 'CMYK'), quality=95)
save('big.jpg', Image.fromarray(smooth(480, 640, 3)), quality=90)
save('rgb.png', Image.fromarray(smooth(33, 21, 3)))
save('rgba.png', Image.fromarray(smooth(20, 20, 4), 'RGBA'))
save('palette.png', Image.fromarray(smooth(25, 25, 3)).convert('P'))
save('gray.png', Image.fromarray(smooth(16, 17, 1)[:, :, 0], 'L'))
b = open(f'{d}/rgb.jpg', 'rb').read()
open(f'{d}/truncated.jpg', 'wb').write(b[:len(b) // 2])
open(f'{d}/text.jpg', 'w').write('not an image')
# A folder: two classes (sorted: apple before banana), a hidden file, and a list file.
for c, n in (('banana', 3), ('apple', 2)):
    os.makedirs(f'{d}/folder/{c}', exist_ok=True)
    for i in range(n):
        Image.fromarray(smooth(30 + i, 40, 3)).save(f'{d}/folder/{c}/{i}.png')
open(f'{d}/folder/apple/.DS_Store', 'w').write('x')
open(f'{d}/list.csv', 'w').write('path,label\nfolder/apple/0.png,1\nfolder/banana/2.png,0\n')
)";
    std::ofstream(dir_ / "write.py") << program;
    const auto r = fabric::testing::run_command(fabric::testing::python_interpreter() + " " +
                                                (dir_ / "write.py").string() + " " + dir_.string());
    ASSERT_EQ(r.code, 0) << r.out;
  }
  static void TearDownTestSuite() { fs::remove_all(dir_); }

  static std::string bytes(const std::string& name) {
    std::ifstream in(dir_ / name, std::ios::binary);
    return std::string((std::istreambuf_iterator<char>(in)), {});
  }
  static torch::Tensor decode(const std::string& name, int64_t min_w = 0, int64_t min_h = 0,
                              int64_t max_pixels = fabric::kDefaultMaxImagePixels) {
    const std::string b = bytes(name);
    return fabric::decode_image(b.data(), b.size(), name, min_w, min_h, max_pixels);
  }
  static std::string error_of(const std::function<void()>& f) {
    try {
      f();
    } catch (const fabric::Error& e) {
      return e.what();
    }
    return "(no error)";
  }
  static inline fs::path dir_;
};

TEST_F(ImageFolderTest, DecodedPixelsArePillowsRgb) {
  for (const std::string name :
       {"rgb.jpg", "gray.jpg", "big.jpg", "rgb.png", "rgba.png", "palette.png", "gray.png"}) {
    const torch::Tensor ours = decode(name);
    const torch::Tensor pillow = fabric::load_npy((dir_ / (name + ".npy")).string());
    ASSERT_EQ(ours.sizes(), pillow.sizes()) << name;
    const int64_t worst =
        (ours.to(torch::kInt32) - pillow.to(torch::kInt32)).abs().max().item<int64_t>();
    EXPECT_EQ(worst, 0) << name << ": largest difference from Pillow";
  }
  // CMYK: Pillow's conversion and R = C·K/255 agree to within rounding.
  const torch::Tensor ours = decode("cmyk.jpg");
  const torch::Tensor pillow = fabric::load_npy((dir_ / "cmyk.jpg.npy").string());
  ASSERT_EQ(ours.sizes(), pillow.sizes());
  EXPECT_LE((ours.to(torch::kInt32) - pillow.to(torch::kInt32)).abs().max().item<int64_t>(), 1);
}

TEST_F(ImageFolderTest, DctScaledDecodingKeepsWhatWasAskedFor) {
  const torch::Tensor full = decode("big.jpg");
  const torch::Tensor quarter = decode("big.jpg", 150, 110);  // 640x480 / 4 = 160x120
  EXPECT_EQ(quarter.sizes(), torch::IntArrayRef({120, 160, 3}));
  EXPECT_EQ(decode("big.jpg", 161, 110).sizes(), torch::IntArrayRef({240, 320, 3}));
  // The same picture: the full decode shrunk by 4 is within a few levels of the scaled decode.
  auto shrunk =
      torch::nn::functional::interpolate(full.permute({2, 0, 1}).unsqueeze(0).to(torch::kFloat),
                                         torch::nn::functional::InterpolateFuncOptions()
                                             .size(std::vector<int64_t>{120, 160})
                                             .mode(torch::kArea));
  const double mean_diff =
      (shrunk[0].permute({1, 2, 0}) - quarter.to(torch::kFloat)).abs().mean().item<double>();
  EXPECT_LT(mean_diff, 4.0);
}

TEST_F(ImageFolderTest, BadImagesAreOneLineErrorsNamingTheFile) {
  EXPECT_EQ(error_of([] { decode("text.jpg"); }), "text.jpg: not a JPEG or PNG image");
  const std::string truncated = error_of([] { decode("truncated.jpg"); });
  EXPECT_EQ(truncated.rfind("truncated.jpg: corrupt JPEG (", 0), 0u) << truncated;
  EXPECT_EQ(error_of([] { decode("rgb.png", 0, 0, 500); }),
            "rgb.png: image is 21x33 = 693 pixels, above the limit of 500 (data.max_image_pixels)");
  for (const std::string& e : {truncated}) EXPECT_EQ(e.find('\n'), std::string::npos);
}

TEST_F(ImageFolderTest, FolderAndListLayouts) {
  fabric::ImageFolderOptions options;
  options.image_size = 16;
  const auto folder = fabric::ImageFolderDataset::from_folder((dir_ / "folder").string(), options);
  EXPECT_EQ(folder->classes(), std::vector<std::string>({"apple", "banana"}));
  EXPECT_EQ(folder->size(), 5);  // .DS_Store ignored
  EXPECT_EQ(folder->labels(), std::vector<int64_t>({0, 0, 1, 1, 1}));
  EXPECT_EQ(fs::path(folder->files()[2]).filename(), "0.png");
  const fabric::Batch b = folder->get_batch({0, 4});
  EXPECT_EQ(b.data.sizes(), torch::IntArrayRef({2, 3, 16, 16}));
  EXPECT_EQ(b.data.scalar_type(), torch::kUInt8);
  EXPECT_TRUE(torch::equal(b.target, torch::tensor({0, 1}, torch::kInt64)));

  const auto list = fabric::ImageFolderDataset::from_list((dir_ / "list.csv").string(), options);
  EXPECT_EQ(list->size(), 2);
  EXPECT_EQ(list->labels(), std::vector<int64_t>({1, 0}));
  EXPECT_TRUE(torch::equal(list->get_batch({0}).data[0], b.data[0]));  // same file, same pixels

  // An empty class folder and a stray file are named.
  fs::create_directories(dir_ / "bad1" / "cherry");
  fs::copy(dir_ / "folder" / "apple", dir_ / "bad1" / "apple");
  EXPECT_EQ(
      error_of([&] { fabric::ImageFolderDataset::from_folder((dir_ / "bad1").string(), options); }),
      (dir_ / "bad1" / "cherry").string() + ": empty class folder (no .jpg, .jpeg or .png files)");
  // A file that is not an image is left out, as torchvision leaves it out, and listed; an image
  // format torchvision lists but this build does not decode is an error naming it.
  fs::copy(dir_ / "folder", dir_ / "notes", fs::copy_options::recursive);
  std::ofstream(dir_ / "notes" / "apple" / "labels.txt") << "x";
  std::ofstream(dir_ / "notes" / "banana" / "README.md") << "x";
  const auto with_notes =
      fabric::ImageFolderDataset::from_folder((dir_ / "notes").string(), options);
  EXPECT_EQ(with_notes->files().size(), folder->files().size());
  EXPECT_EQ(with_notes->not_images(),
            (std::vector<std::string>{(dir_ / "notes" / "apple" / "labels.txt").string(),
                                      (dir_ / "notes" / "banana" / "README.md").string()}));
  EXPECT_TRUE(folder->not_images().empty());
  fs::create_directories(dir_ / "bad2" / "apple");
  std::ofstream(dir_ / "bad2" / "apple" / "photo.webp") << "x";
  EXPECT_EQ(
      error_of([&] { fabric::ImageFolderDataset::from_folder((dir_ / "bad2").string(), options); }),
      (dir_ / "bad2" / "apple" / "photo.webp").string() +
          ": an image format this build does not decode (it reads .jpg, .jpeg and .png); convert "
          "it, or move it out of " +
          (dir_ / "bad2").string());
  std::ofstream(dir_ / "bad.csv") << "path,label\nfolder/apple/0.png,x\n";
  EXPECT_EQ(error_of([&] {
              fabric::ImageFolderDataset::from_list((dir_ / "bad.csv").string(), options);
            }),
            (dir_ / "bad.csv").string() + ":2: label 'x' is not an integer >= 0");
}

TEST_F(ImageFolderTest, RandomCropsComeFromTheBatchGenerator) {
  fabric::ImageFolderOptions options;
  options.image_size = 12;
  const auto data = fabric::ImageFolderDataset::from_folder((dir_ / "folder").string(), options);
  auto batch_with_seed = [&](uint64_t seed) {
    at::Generator gen = at::detail::createCPUGenerator(seed);
    return data->get_batch({0, 1, 2, 3, 4}, gen).data;
  };
  const torch::Tensor a = batch_with_seed(7), b = batch_with_seed(7), c = batch_with_seed(8);
  EXPECT_TRUE(torch::equal(a, b));
  EXPECT_FALSE(torch::equal(a, c));
  options.train = false;
  const auto eval = fabric::ImageFolderDataset::from_folder((dir_ / "folder").string(), options);
  at::Generator gen = at::detail::createCPUGenerator(7);
  EXPECT_TRUE(torch::equal(eval->get_batch({0, 1}, gen).data, eval->get_batch({0, 1}).data));
}

// The loader's read-ahead (will_read) opens an image file and hands the open file to the thread
// that decodes it: a file removed after its hint still decodes, to the same pixels; without a
// hint the removal is an error naming the file; a file is handed over once.
TEST_F(ImageFolderTest, AHintedFileIsReadThroughTheFileTheHintOpened) {
  fs::create_directories(dir_ / "hint" / "a");
  fs::copy(dir_ / "rgb.jpg", dir_ / "hint" / "a" / "0.jpg");
  fs::copy(dir_ / "rgb.png", dir_ / "hint" / "a" / "1.png");
  fabric::ImageFolderOptions options;
  options.image_size = 8;
  const auto data = fabric::ImageFolderDataset::from_folder((dir_ / "hint").string(), options);
  const torch::Tensor expected = data->get_batch({0, 1}).data;
  data->will_read({0, 1});
  fs::remove(dir_ / "hint" / "a" / "0.jpg");
  fs::remove(dir_ / "hint" / "a" / "1.png");
  EXPECT_TRUE(torch::equal(data->get_batch({0, 1}).data, expected));
  EXPECT_EQ(error_of([&] { data->get_batch({0}); }),
            (dir_ / "hint" / "a" / "0.jpg").string() + ": cannot read: No such file or directory");
}

TEST_F(ImageFolderTest, SkipBadFilesShortensTheBatchAndCountsOnce) {
  fs::create_directories(dir_ / "skip" / "a");
  fs::copy(dir_ / "rgb.jpg", dir_ / "skip" / "a" / "0.jpg");
  fs::copy(dir_ / "truncated.jpg", dir_ / "skip" / "a" / "1.jpg");
  fs::copy(dir_ / "rgb.png", dir_ / "skip" / "a" / "2.png");
  fabric::ImageFolderOptions options;
  options.image_size = 8;
  const auto strict = fabric::ImageFolderDataset::from_folder((dir_ / "skip").string(), options);
  const std::string error = error_of([&] { strict->get_batch({0, 1, 2}); });
  EXPECT_EQ(error.rfind((dir_ / "skip" / "a" / "1.jpg").string() + ": corrupt JPEG (", 0), 0u)
      << error;
  options.skip_bad_files = true;
  const auto lenient = fabric::ImageFolderDataset::from_folder((dir_ / "skip").string(), options);
  EXPECT_EQ(lenient->get_batch({0, 1, 2}).data.size(0), 2);
  EXPECT_EQ(lenient->get_batch({1, 2}).target.size(0), 1);
  EXPECT_EQ(lenient->bad_files(), 1);
}

}  // namespace
