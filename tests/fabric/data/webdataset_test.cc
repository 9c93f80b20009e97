// WebDataset shards (fabric/data/webdataset.h, ImageFolderDataset::from_webdataset) on tar files
// written by Python's tarfile (the setup's Python): brace patterns expand as the braceexpand
// package does; ustar, GNU and pax archives list the members Python wrote, with their bytes;
// samples group consecutive members by key; images decoded from shards equal the same files
// decoded from a folder list; every bad input is one line naming the shard, and 2,000 randomly
// damaged archives give an error or a listing, never a crash.
#include "fabric/data/webdataset.h"

#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <torch/types.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>

#include "fabric/core/error.h"
#include "fabric/data/image_folder.h"
#include "tests/run_command.h"

namespace fs = std::filesystem;

namespace {

using fabric::expand_braces;

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const fabric::Error& e) {
    return e.what();
  }
  return "";
}

TEST(ExpandBracesTest, RangesListsAndProductsAsBraceexpand) {
  EXPECT_EQ(expand_braces("train-{000..003}.tar"),
            (std::vector<std::string>{"train-000.tar", "train-001.tar", "train-002.tar",
                                      "train-003.tar"}));
  EXPECT_EQ(expand_braces("s{8..11}"), (std::vector<std::string>{"s8", "s9", "s10", "s11"}));
  EXPECT_EQ(expand_braces("s{08..11}"), (std::vector<std::string>{"s08", "s09", "s10", "s11"}));
  EXPECT_EQ(expand_braces("{2..0}"), (std::vector<std::string>{"2", "1", "0"}));
  EXPECT_EQ(expand_braces("{a,b}-{0..1}"), (std::vector<std::string>{"a-0", "a-1", "b-0", "b-1"}));
  EXPECT_EQ(expand_braces("x{a,{b,c}}y"), (std::vector<std::string>{"xay", "xby", "xcy"}));
  EXPECT_EQ(expand_braces("plain.tar"), (std::vector<std::string>{"plain.tar"}));
  EXPECT_EQ(expand_braces("{x}-{1..2}"), (std::vector<std::string>{"{x}-1", "{x}-2"}));
  EXPECT_EQ(error_of([] { expand_braces("train-{000..009.tar"); }),
            "train-{000..009.tar: unmatched '{'");
  EXPECT_EQ(error_of([] { expand_braces("train}-0.tar"); }), "train}-0.tar: unmatched '}'");
  EXPECT_EQ(error_of([] { expand_braces("{0..9999999}"); }),
            "{0..9999999}: {0..9999999} names more than 1000000 shards");
}

class WebDatasetTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    std::string tmpl = (fs::path(::testing::TempDir()) / "wds_XXXXXX").string();
    dir_ = mkdtemp(tmpl.data());
    const std::string program = R"(
import io, os, sys, tarfile, numpy as np
from PIL import Image
d = sys.argv[1]
rng = np.random.default_rng(0)
def add(tar, name, data, kind=tarfile.REGTYPE):
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.type = kind
    tar.addfile(info, io.BytesIO(data))
# The same members in the three header formats: a long name (> 100 bytes), an empty member, a
# directory, a symlink and a member of 1,000 random bytes.
payload = bytes(rng.integers(0, 256, 1000, dtype=np.uint8))
long = 'deep/' + 'x' * 120 + '/sample.bin'
for fmt, name in ((tarfile.USTAR_FORMAT, 'ustar'), (tarfile.GNU_FORMAT, 'gnu'),
                  (tarfile.PAX_FORMAT, 'pax')):
    with tarfile.open(f'{d}/{name}.tar', 'w', format=fmt) as tar:
        add(tar, 'a/one.txt', b'first member')
        info = tarfile.TarInfo('a'); info.type = tarfile.DIRTYPE; tar.addfile(info)
        add(tar, 'empty.dat', b'')
        info = tarfile.TarInfo('link'); info.type = tarfile.SYMTYPE; info.linkname = 'a/one.txt'
        tar.addfile(info)
        add(tar, 'random.bin', payload)
        if fmt != tarfile.USTAR_FORMAT or len(long) <= 255:
            add(tar, long if fmt != tarfile.USTAR_FORMAT else 'p/' + 'y' * 90 + '/s.bin', b'long')
open(f'{d}/random.bin', 'wb').write(payload)
# WebDataset shards: 7 samples over two shards (KEY.jpg or KEY.png + KEY.cls), and the same
# images as files with a path,label list, to decode both ways.
os.makedirs(f'{d}/files', exist_ok=True)
lines = []
k = 0
for shard, count in ((0, 4), (1, 3)):
    with tarfile.open(f'{d}/shard-{shard:03d}.tar', 'w', format=tarfile.GNU_FORMAT) as tar:
        for i in range(count):
            im = Image.fromarray(rng.integers(0, 256, (20 + k, 30, 3), dtype=np.uint8))
            ext = 'png' if k % 3 == 0 else 'jpg'
            buf = io.BytesIO(); im.save(buf, format='PNG' if ext == 'png' else 'JPEG'); b = buf.getvalue()
            key = f'class{k % 2}/img_{k:04d}'
            add(tar, f'{key}.{ext}', b)
            add(tar, f'{key}.cls', f'{k % 2}\n'.encode())
            add(tar, f'{key}.json', b'{}')
            open(f'{d}/files/{k}.{ext}', 'wb').write(b)
            lines.append(f'files/{k}.{ext},{k % 2}')
            k += 1
open(f'{d}/list.csv', 'w').write('\n'.join(lines) + '\n')
# Bad shards.
jpg = open(f'{d}/files/1.jpg', 'rb').read()
with tarfile.open(f'{d}/nolabel.tar', 'w') as tar:
    add(tar, 'k1.jpg', jpg); add(tar, 'k1.cls', b'0'); add(tar, 'k2.jpg', jpg); add(tar, 'k2.txt', b'x')
with tarfile.open(f'{d}/noimage.tar', 'w') as tar:
    add(tar, 'k1.cls', b'0'); add(tar, 'k1.json', b'{}')
with tarfile.open(f'{d}/badlabel.tar', 'w') as tar:
    add(tar, 'k1.jpg', jpg); add(tar, 'k1.cls', b'cat')
with tarfile.open(f'{d}/badimage.tar', 'w') as tar:
    add(tar, 'k1.jpg', b'not a jpeg'); add(tar, 'k1.cls', b'1')
b = open(f'{d}/shard-000.tar', 'rb').read()
open(f'{d}/truncated.tar', 'wb').write(b[:len(b) // 2])
open(f'{d}/text.tar', 'w').write('hello ' * 200)
)";
    const std::string script = (dir_ / "make.py").string();
    std::ofstream(script) << program;
    const char* python = std::getenv("PYTHON");
    const auto r = fabric::testing::run_command(std::string(python ? python : "python3") + " " +
                                                script + " " + dir_.string());
    ASSERT_EQ(r.code, 0) << r.out;
  }
  static void TearDownTestSuite() { fs::remove_all(dir_); }

  static std::string path(const std::string& name) { return (dir_ / name).string(); }
  static std::string bytes(const std::string& file) {
    std::ifstream in(file, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }

  static fs::path dir_;
};

fs::path WebDatasetTest::dir_;

TEST_F(WebDatasetTest, UstarGnuAndPaxArchivesListWhatPythonWrote) {
  const std::string long_name = "deep/" + std::string(120, 'x') + "/sample.bin";
  for (const std::string format : {"ustar", "gnu", "pax"}) {
    const auto members = fabric::list_tar(path(format + ".tar"));
    ASSERT_EQ(members.size(), 4u) << format;  // the directory and the link are not members
    EXPECT_EQ(members[0].name, "a/one.txt");
    EXPECT_EQ(
        fabric::read_file_range(path(format + ".tar"), members[0].offset, members[0].size, "m"),
        "first member");
    EXPECT_EQ(members[1].name, "empty.dat");
    EXPECT_EQ(members[1].size, 0);
    EXPECT_EQ(members[2].name, "random.bin");
    EXPECT_EQ(
        fabric::read_file_range(path(format + ".tar"), members[2].offset, members[2].size, "m"),
        bytes(path("random.bin")));
    EXPECT_EQ(members[3].name,
              format == "ustar" ? "p/" + std::string(90, 'y') + "/s.bin" : long_name)
        << format;
  }
}

TEST_F(WebDatasetTest, SamplesGroupConsecutiveMembersByKey) {
  const auto samples = fabric::index_webdataset({path("shard-000.tar"), path("shard-001.tar")});
  ASSERT_EQ(samples.size(), 7u);
  EXPECT_EQ(samples[0].key, "class0/img_0000");
  EXPECT_EQ(samples[0].shard, 0u);
  ASSERT_EQ(samples[0].members.size(), 3u);
  EXPECT_EQ(samples[0].members[0].first, "png");
  EXPECT_EQ(samples[0].members[1].first, "cls");
  EXPECT_EQ(samples[0].members[2].first, "json");
  EXPECT_EQ(samples[4].key, "class0/img_0004");
  EXPECT_EQ(samples[4].shard, 1u);
}

TEST_F(WebDatasetTest, ShardImagesDecodeAsTheSameFilesDo) {
  fabric::ImageFolderOptions options;
  options.image_size = 16;
  const auto shards = fabric::expand_braces(path("shard-{000..001}.tar"));
  const auto from_shards = fabric::ImageFolderDataset::from_webdataset(shards, options);
  const auto from_files = fabric::ImageFolderDataset::from_list(path("list.csv"), options);
  ASSERT_EQ(from_shards->size(), 7);
  EXPECT_EQ(from_shards->classes(), (std::vector<std::string>{"0", "1"}));
  EXPECT_EQ(from_shards->labels(), from_files->labels());
  EXPECT_EQ(from_shards->files()[1], shards[0] + ":class1/img_0001.jpg");
  const std::vector<int64_t> all = {6, 0, 3, 1, 5, 2, 4};
  // The eval pipeline, and the train pipeline with the same generator: the same pixels.
  EXPECT_TRUE(torch::equal(from_shards->get_batch(all).data, from_files->get_batch(all).data));
  auto g1 = at::make_generator<at::CPUGeneratorImpl>(7);
  auto g2 = at::make_generator<at::CPUGeneratorImpl>(7);
  const auto a = from_shards->get_batch(all, g1), b = from_files->get_batch(all, g2);
  EXPECT_TRUE(torch::equal(a.data, b.data));
  EXPECT_TRUE(torch::equal(a.target, b.target));
}

TEST_F(WebDatasetTest, BadShardsAreOneLineNamingTheShard) {
  fabric::ImageFolderOptions options;
  options.image_size = 8;
  auto open = [&](const std::string& name) {
    return error_of([&] { fabric::ImageFolderDataset::from_webdataset({path(name)}, options); });
  };
  EXPECT_EQ(open("nolabel.tar"),
            path("nolabel.tar") + ":k2: sample has no label member (.cls); its members: jpg, txt");
  EXPECT_EQ(open("noimage.tar"), path("noimage.tar") +
                                     ":k1: sample has no image member (.jpg, .jpeg or .png); its "
                                     "members: cls, json");
  EXPECT_EQ(open("badlabel.tar"),
            path("badlabel.tar") + ":k1.cls: label 'cat' is not an integer >= 0");
  const std::string truncated = open("truncated.tar");
  EXPECT_EQ(truncated.rfind(path("truncated.tar") + ": truncated: ", 0), 0u) << truncated;
  EXPECT_EQ(open("text.tar"), path("text.tar") +
                                  ": not a tar file, or damaged (the header at byte 0 has a "
                                  "wrong checksum)");
  EXPECT_EQ(open("missing.tar"), path("missing.tar") + ": cannot read (No such file or directory)");
  // An image that does not decode: an error naming the shard and member when the batch needs it,
  // or with skip_bad_files a shorter batch.
  const auto bad = fabric::ImageFolderDataset::from_webdataset({path("badimage.tar")}, options);
  EXPECT_EQ(error_of([&] { bad->get_batch({0}); }),
            path("badimage.tar") + ":k1.jpg: not a JPEG or PNG image");
  EXPECT_TRUE(fabric::one_line(open("nolabel.tar")) == open("nolabel.tar"));
}

TEST_F(WebDatasetTest, DamagedArchivesGiveAnErrorOrAListingNeverACrash) {
  const std::string good = bytes(path("gnu.tar"));
  std::mt19937 rng(1);
  const std::string file = path("damaged.tar");
  int errors = 0;
  for (int trial = 0; trial < 2000; ++trial) {
    std::string b = good;
    const int flips = 1 + static_cast<int>(rng() % 8);
    for (int i = 0; i < flips; ++i) b[rng() % b.size()] = static_cast<char>(rng());
    if (trial % 5 == 0) b.resize(rng() % b.size());
    std::ofstream(file, std::ios::binary | std::ios::trunc) << b;
    try {
      for (const auto& m : fabric::list_tar(file)) {
        ASSERT_GE(m.offset, 0);
        ASSERT_LE(m.offset + m.size, static_cast<int64_t>(b.size()));
      }
    } catch (const fabric::Error& e) {
      ++errors;
      EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos) << e.what();
    }
  }
  EXPECT_GT(errors, 100);  // damage is noticed (checksums), not only survived
}

}  // namespace
