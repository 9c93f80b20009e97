// //examples:image_classifier on data written from the real Fashion-MNIST files on this machine,
// in each format: NumPy (a train split as .npy files of [N, H, W] uint8, a val split as an .npz)
// image folders (train/<class>/*.jpg and val/<class>/*.png written by Pillow) and WebDataset tar
// shards (KEY.jpg/KEY.png + KEY.cls, written by tarfile). Each trains to
// the accuracy band of the binary-format example on the same images; over 2 ranks, resumed from a
// checkpoint in the middle of an epoch, each ends with weights bitwise those of the uninterrupted
// run; a corrupt image stops the run with one line naming it, or with data.skip_bad_files is
// left out and counted; a missing split is one line naming what was expected, as are bad labels
// and empty splits.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <string>

#include "tests/integration/examples_fixture.h"

namespace fs = std::filesystem;

namespace {

using fabric::testing::ExamplesTest;
using fabric::testing::Result;

class ImageClassifierTest : public ExamplesTest {
 protected:
  // Runs the Python `program` (as dir_/NAME.py) after a prelude that reads the first `train`
  // Fashion-MNIST training images and labels (x, y, uint8) and the first `val` test ones (xv, yv)
  // and sets `root`; `extra` are more arguments (sys.argv[5:]). Returns `root`.
  fs::path write_fashion_mnist(const std::string& name, const std::string& program,
                               const fs::path& root, int train, int val,
                               const std::string& extra = "") {
    const fs::path script = dir_ / (name + ".py");
    std::ofstream(script) << R"(import gzip, io, os, sys, tarfile, numpy as np
src, root, ntrain, nval = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
def idx(name, offset):
    return np.frombuffer(gzip.open(f'{src}/{name}.gz').read(), np.uint8, offset=offset)
x = idx('train-images-idx3-ubyte', 16).reshape(-1, 28, 28)[:ntrain]
y = idx('train-labels-idx1-ubyte', 8)[:ntrain]
xv = idx('t10k-images-idx3-ubyte', 16).reshape(-1, 28, 28)[:nval]
yv = idx('t10k-labels-idx1-ubyte', 8)[:nval]
)" << program;
    const auto r =
        fabric::testing::run_command(fabric::testing::python_interpreter() + " " + script.string() +
                                     " /usr/share/datasets/fashion-mnist " + root.string() + " " +
                                     std::to_string(train) + " " + std::to_string(val) + extra);
    EXPECT_EQ(r.code, 0) << r.out;
    return root;
  }

  // DIR/train/{inputs,targets}.npy (the first `train` images) and DIR/val.npz (the first `val`
  // test images) from /usr/share/datasets/fashion-mnist.
  fs::path write_npy_data(int train, int val) {
    const fs::path root = dir_ / "fmnist_npy";
    const std::string program =
        "os.makedirs(f'{root}/train', exist_ok=True)\n"
        "np.save(f'{root}/train/inputs.npy', x); np.save(f'{root}/train/targets.npy', y)\n"
        "np.savez(f'{root}/val.npz', inputs=xv, targets=yv.astype(np.int64))\n";
    return write_fashion_mnist("write", program, root, train, val);
  }

  // DIR/train/<label>_<name>/*.jpg and DIR/val/<label>_<name>/*.png, as Pillow writes them.
  fs::path write_image_folders(int train, int val) {
    const fs::path root = dir_ / "fmnist_images";
    const std::string program = R"(
from PIL import Image
names = ['tshirt', 'trouser', 'pullover', 'dress', 'coat', 'sandal', 'shirt', 'sneaker', 'bag',
         'boot']
for split, xs, ys, ext in (('train', x, y, 'jpg'), ('val', xv, yv, 'png')):
    for i, (im, label) in enumerate(zip(xs, ys)):
        d = f'{root}/{split}/{label}_{names[label]}'
        os.makedirs(d, exist_ok=True)
        Image.fromarray(im, 'L').save(f'{d}/{i:05d}.{ext}', **({'quality': 95} if ext == 'jpg' else {}))
)";
    return write_fashion_mnist("write_images", program, root, train, val);
  }

  // WebDataset shards: DIR/train-{000..S-1}.tar (the train images as KEY.jpg + KEY.cls, split
  // unevenly over S shards) and DIR/val/val-000.tar (PNG), as Python's tarfile writes them.
  fs::path write_shards(int train, int val, int shards) {
    const fs::path root = dir_ / "fmnist_shards";
    const std::string program = R"(
from PIL import Image
nshards = int(sys.argv[5])
def add(tar, name, data):
    info = tarfile.TarInfo(name); info.size = len(data); tar.addfile(info, io.BytesIO(data))
def write(path, xs, ys, ext):
    with tarfile.open(path, 'w') as tar:
        for i, im in xs:
            buf = io.BytesIO()
            Image.fromarray(im, 'L').save(buf, format='JPEG' if ext == 'jpg' else 'PNG',
                                          **({'quality': 95} if ext == 'jpg' else {}))
            add(tar, f'{i:05d}.{ext}', buf.getvalue()); add(tar, f'{i:05d}.cls', str(ys[i]).encode())
os.makedirs(f'{root}/val', exist_ok=True)
bounds = [0] + sorted(np.random.default_rng(0).choice(np.arange(1, ntrain), nshards - 1, replace=False).tolist()) + [ntrain]
for s in range(nshards):
    write(f'{root}/train-{s:03d}.tar', [(i, x[i]) for i in range(bounds[s], bounds[s + 1])], y, 'jpg')
write(f'{root}/val/val-000.tar', list(enumerate(xv)), yv, 'png')
)";
    return write_fashion_mnist("write_shards", program, root, train, val,
                               " " + std::to_string(shards));
  }

  // `r` trained 4096 images described as `counts` to test accuracy above `floor` and within 0.1
  // of the binary-format example on the same images.
  void expect_accuracy_band(const Result& r, const std::string& counts, double floor) {
    ASSERT_EQ(r.code, 0) << r.out;
    EXPECT_NE(r.out.find(counts), std::string::npos) << r.out;
    const double accuracy = summary_of(r)["test_accuracy"].get<double>();
    const double reference = binary_example_accuracy();
    std::cout << "test accuracy " << accuracy << ", binary example " << reference << std::endl;
    EXPECT_GT(accuracy, floor) << r.out;
    EXPECT_GT(accuracy, reference - 0.1) << "binary example: " << reference << "\n" << r.out;
  }

  // The binary-format example's small CNN on 128 steps of batch 64 of the same images; run once
  // per test process (it is deterministic), the three formats' tests compare with the one figure.
  double binary_example_accuracy() {
    static std::optional<double> accuracy;
    if (accuracy) return *accuracy;
    Result binary = run("fashion_mnist",
                        "--config=fashion_mnist.yaml fabric.accelerator=cpu data.batch_size=64 "
                        "trainer.max_steps=128 trainer.limit_eval_batches=16");
    EXPECT_EQ(binary.code, 0) << binary.out;
    if (binary.code != 0) return 0.0;
    accuracy = summary_of(binary)["test_accuracy"].get<double>();
    return *accuracy;
  }

  // Two ranks, 4 steps an epoch; resumed from the checkpoint at step 6 (the middle of epoch 2).
  void expect_resume_bitwise_on(const fs::path& root, const std::string& extra);
};

const char* const kSmall =
    " fabric.accelerator=cpu model.width=8 data.batch_size=64 optimizer.lr=0.05"
    " logging.log_every_n_steps=10";

TEST_F(ImageClassifierTest, NpyFashionMnistReachesTheBinaryExamplesAccuracyBand) {
  const fs::path root = write_npy_data(4096, 1000);
  Result npy = run("image_classifier", "--config=single_cpu.yaml data.root=" + root.string() +
                                           kSmall + " trainer.max_epochs=2 trainer.max_steps=-1");
  expect_accuracy_band(npy, "4096 train / 1000 val images [1, 28, 28], 10 classes", 0.7);
}

void ImageClassifierTest::expect_resume_bitwise_on(const fs::path& root, const std::string& extra) {
  ExamplesTest::expect_resume_bitwise("image_classifier",
                                      "--config=ddp.yaml data.root=" + root.string() + kSmall +
                                          extra +
                                          " trainer.max_epochs=3 checkpoint.every_n_steps=6",
                                      6, 12);
}

TEST_F(ImageClassifierTest, NpyOverTwoRanksResumesMidEpochBitwise) {
  expect_resume_bitwise_on(write_npy_data(512, 128), "");
}

TEST_F(ImageClassifierTest, ImageFolderFashionMnistReachesTheBinaryExamplesAccuracyBand) {
  const fs::path root = write_image_folders(4096, 1000);
  Result images =
      run("image_classifier", "--config=single_cpu.yaml data.root=" + root.string() + kSmall +
                                  " data.image_size=28 trainer.max_epochs=2 trainer.max_steps=-1");
  // Random resized crops: a harder task in 128 steps.
  expect_accuracy_band(images, "4096 train / 1000 val images [3, 28, 28], 10 classes", 0.65);
}

// Random resized crops and flips drawn per batch: the resumed run decodes exactly the same crops,
// whichever of the two loader threads builds a batch.
TEST_F(ImageClassifierTest, ImageFolderOverTwoRanksResumesMidEpochBitwise) {
  expect_resume_bitwise_on(write_image_folders(512, 128), " data.image_size=24 data.num_workers=2");
}

// data.train_shards as a brace pattern, the val shards found in DIR/val/.
TEST_F(ImageClassifierTest, WebDatasetFashionMnistReachesTheBinaryExamplesAccuracyBand) {
  const fs::path root = write_shards(4096, 1000, 4);
  Result shards =
      run("image_classifier", "--config=single_cpu.yaml data.root=" + root.string() + kSmall +
                                  " data.train_shards=train-{000..003}.tar data.image_size=28"
                                  " trainer.max_epochs=2 trainer.max_steps=-1");
  expect_accuracy_band(shards, "4096 train / 1000 val images [3, 28, 28], 10 classes", 0.65);
}

// Samples of 3 uneven shards partitioned over 2 ranks by the sampler, decoded by 2 loader threads
// each, found by data.format: auto (DIR/train-*.tar is not DIR/train/*.tar: the pattern is given).
TEST_F(ImageClassifierTest, WebDatasetOverTwoRanksResumesMidEpochBitwise) {
  expect_resume_bitwise_on(write_shards(512, 128, 3),
                           " data.train_shards=train-{000..002}.tar data.image_size=24"
                           " data.num_workers=2");
}

// Streamed (data.shuffle_buffer): each rank reads its contiguous part of the epoch's shard order
// through a shuffle buffer; the checkpoint holds rank 0's stream position, and the resumed run
// continues with the batches and crops of the uninterrupted one.
TEST_F(ImageClassifierTest, StreamedWebDatasetOverTwoRanksResumesMidEpochBitwise) {
  expect_resume_bitwise_on(write_shards(512, 128, 3),
                           " data.train_shards=train-{000..002}.tar data.image_size=24"
                           " data.num_workers=2 data.shuffle_buffer=100");
  const std::string ckpt = bytes(dir_ / "whole" / "checkpoints" / "step-00000006.ckpt");
  EXPECT_NE(ckpt.find("stream_offset"), std::string::npos) << "a streamed loader's checkpoint";
}

TEST_F(ImageClassifierTest, WebDatasetShardErrorsAreOneLine) {
  const fs::path root = write_shards(64, 16, 2);
  const std::string args = "--config=single_cpu.yaml data.root=" + root.string() + kSmall +
                           " data.image_size=28 trainer.max_steps=1 data.format=webdataset";
  Result missing = run("image_classifier", args + " data.train_shards=train-{000..002}.tar");
  EXPECT_EQ(missing.code, 2) << missing.out;
  EXPECT_NE(missing.out.find("data.train_shards: " + (root / "train-002.tar").string() +
                             " does not exist (one of the shards 'train-{000..002}.tar' names)"),
            std::string::npos)
      << missing.out;
  Result none = run("image_classifier", args);
  EXPECT_EQ(none.code, 2) << none.out;
  EXPECT_NE(none.out.find("data.train_shards: no shards: set it (e.g. train-{000..009}.tar) or "
                          "put " +
                          (root / "train").string() + "/*.tar"),
            std::string::npos)
      << none.out;
  std::ofstream(root / "val" / "val-000.tar", std::ios::binary | std::ios::trunc) << "garbage";
  Result damaged = run("image_classifier", args + " data.train_shards=train-{000..001}.tar");
  EXPECT_EQ(damaged.code, 1) << damaged.out;
  EXPECT_NE(damaged.out.find((root / "val" / "val-000.tar").string() + ": truncated: "),
            std::string::npos)
      << damaged.out;
}

TEST_F(ImageClassifierTest, ACorruptImageStopsTheRunOrIsSkippedAndCounted) {
  const fs::path root = write_image_folders(256, 64);
  const fs::path bad = root / "train" / "0_tshirt" / "zz_corrupt.jpg";
  std::ofstream(bad, std::ios::binary) << std::string("\xFF\xD8\xFF\xE0 truncated", 14);
  const fs::path notes = root / "train" / "0_tshirt" / "labels.txt";  // left out, as torchvision
  std::ofstream(notes) << "0 tshirt\n";
  const std::string args = "--config=single_cpu.yaml data.root=" + root.string() + kSmall +
                           " data.image_size=28 trainer.max_steps=-1 trainer.max_epochs=1";
  Result strict = run("image_classifier", args);
  EXPECT_EQ(strict.code, 1) << strict.out;
  EXPECT_NE(strict.out.find(bad.string() + ": corrupt JPEG ("), std::string::npos) << strict.out;
  Result lenient = run("image_classifier", args + " data.skip_bad_files=true");
  ASSERT_EQ(lenient.code, 0) << lenient.out;
  EXPECT_NE(lenient.out.find("warning: skipped " + bad.string() + ": corrupt JPEG ("),
            std::string::npos)
      << lenient.out;
  EXPECT_NE(lenient.out.find("skipped 1 unreadable image files (data.skip_bad_files)"),
            std::string::npos)
      << lenient.out;
  EXPECT_EQ(summary_of(lenient)["bad_files"], 1);
  EXPECT_NE(lenient.out.find("image_classifier: left out 1 non-image file, as torchvision's "
                             "ImageFolder does (first: " +
                             notes.string() + ")"),
            std::string::npos)
      << lenient.out;
}

TEST_F(ImageClassifierTest, MissingSplitsAndFoldersAreOneLine) {
  const fs::path root = write_npy_data(64, 16);
  fs::remove(root / "val.npz");
  Result r = run("image_classifier", "data.root=" + root.string() + " fabric.accelerator=cpu");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find(root.string() + ": no val split: expected " + (root / "val").string() +
                       "/inputs.npy (with targets.npy) or " + (root / "val.npz").string()),
            std::string::npos)
      << r.out;
  Result none = run("image_classifier", "fabric.accelerator=cpu");
  EXPECT_EQ(none.code, 2) << none.out;
  EXPECT_NE(none.out.find("data.root: set it to your data folder, e.g. data.root=DIR"),
            std::string::npos)
      << none.out;
}

// Labels are checked when the data opens, each error one line naming the file and the row (before,
// float labels failed deep in LibTorch, a label of 2**40 tried a 140 TB allocation, a val label
// outside the classes counted as a miss, an empty val split reported accuracy 0).
TEST_F(ImageClassifierTest, BadLabelsAndEmptySplitsAreFoundWhenTheDataOpens) {
  const fs::path script = dir_ / "bad_labels.py";
  std::ofstream(script) << R"(import os, sys, numpy as np
base = sys.argv[1]
def write(name, y, yv, n=32, nv=8):
    root = f'{base}/{name}'
    os.makedirs(f'{root}/train', exist_ok=True)
    np.save(f'{root}/train/inputs.npy', np.zeros((n, 8, 8), np.uint8))
    np.save(f'{root}/train/targets.npy', y)
    np.savez(f'{root}/val.npz', inputs=np.zeros((nv, 8, 8), np.uint8), targets=yv)
ok, okv = np.arange(32) % 10, np.arange(8) % 10
write('float', ok.astype(np.float32), okv)
write('negative', np.where(np.arange(32) == 5, -1, ok), okv)
write('huge', np.where(np.arange(32) == 7, 2**40, ok), okv)
write('outside', ok, np.where(np.arange(8) == 3, 12, okv))
write('empty_val', ok, okv[:0], nv=0)
write('empty_train', ok[:0], okv, n=0)
)";
  const auto made = fabric::testing::run_command(fabric::testing::python_interpreter() + " " +
                                                 script.string() + " " + dir_.string());
  ASSERT_EQ(made.code, 0) << made.out;
  const std::string d = dir_.string();
  for (const auto& [name, line] : std::vector<std::pair<std::string, std::string>>{
           {"float", d + "/float/train/targets.npy: labels are Float; class labels are integers "
                         "(np.save(f, y.astype(np.int64)))"},
           {"negative", d + "/negative/train/targets.npy: label -1 at row 5; class labels are 0, "
                            "1, 2, ..."},
           {"huge", d + "/huge/train/targets.npy: label 1099511627776 at row 7 would make "
                        "1099511627777 classes (at most 1048576); class labels are 0 .. C-1"},
           {"outside", d + "/outside/val.npz:targets: label 12 at row 3 is no class of the train "
                           "split (0..9)"},
           {"empty_val", d + "/empty_val/val.npz:inputs: the val split holds no examples"},
           {"empty_train", d + "/empty_train/train/inputs.npy: the train split holds no examples"},
       }) {
    Result r = run("image_classifier", "data.root=" + d + "/" + name + " fabric.accelerator=cpu");
    EXPECT_EQ(r.code, 1) << name << ":\n" << r.out;
    EXPECT_NE(r.out.find("error: " + line), std::string::npos) << name << ":\n" << r.out;
  }
}

}  // namespace
