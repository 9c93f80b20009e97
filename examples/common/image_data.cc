#include "examples/common/image_data.h"

#include <torch/types.h>
#include <zlib.h>

#include <sys/wait.h>

#include <cstdlib>
#include <fstream>

#include "fabric/core/paths.h"

namespace fs = std::filesystem;

namespace examples {
namespace {

constexpr const char* kCifarFiles[] = {"data_batch_1.bin", "data_batch_2.bin", "data_batch_3.bin",
                                       "data_batch_4.bin", "data_batch_5.bin", "test_batch.bin"};
constexpr int64_t kCifarRecord = 1 + 3 * 32 * 32;

std::string read_gzip_or_plain(const fs::path& file) {
  gzFile gz = gzopen(file.c_str(), "rb");  // reads plain files transparently too
  if (gz == nullptr) throw fabric::Error("cannot open " + file.string());
  std::string data;
  char buf[1 << 16];
  int n;
  while ((n = gzread(gz, buf, sizeof(buf))) > 0) data.append(buf, static_cast<size_t>(n));
  const bool failed = n < 0;
  gzclose(gz);
  if (failed) throw fabric::Error(file.string() + ": corrupt gzip data");
  return data;
}

uint32_t big_endian(const std::string& data, size_t offset) {
  const auto* p = reinterpret_cast<const unsigned char*>(data.data() + offset);
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | p[3];
}

fs::path cifar_dir(const fs::path& root) {
  if (fs::exists(root / "cifar-10-batches-bin" / kCifarFiles[0]))
    return root / "cifar-10-batches-bin";
  return root;
}

std::string shell_quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

}  // namespace

torch::Tensor read_idx(const fs::path& file) {
  const std::string data = read_gzip_or_plain(file);
  if (data.size() < 4 || data[0] != 0 || data[1] != 0 || data[2] != 0x08) {
    throw fabric::Error(file.string() + ": not an IDX file of unsigned bytes (bad magic number)");
  }
  const int dims = static_cast<unsigned char>(data[3]);
  std::vector<int64_t> shape;
  size_t offset = 4;
  int64_t count = 1;
  for (int d = 0; d < dims; ++d, offset += 4) {
    if (data.size() < offset + 4) throw fabric::Error(file.string() + ": truncated header");
    shape.push_back(big_endian(data, offset));
    count *= shape.back();
  }
  if (data.size() != offset + static_cast<size_t>(count)) {
    throw fabric::Error(file.string() + ": expected " + std::to_string(count) +
                        " bytes of data, found " + std::to_string(data.size() - offset));
  }
  auto t = torch::empty(shape, torch::kUInt8);
  std::memcpy(t.data_ptr<uint8_t>(), data.data() + offset, static_cast<size_t>(count));
  return t;
}

ImageSplits load_fashion_mnist(const fs::path& root) {
  auto split = [&](const std::string& prefix) {
    auto images = read_idx(root / (prefix + "-images-idx3-ubyte.gz"));
    auto labels = read_idx(root / (prefix + "-labels-idx1-ubyte.gz"));
    if (images.dim() != 3 || labels.dim() != 1 || images.size(0) != labels.size(0)) {
      throw fabric::Error(root.string() + ": " + prefix + " images and labels do not match");
    }
    return std::make_shared<const fabric::TensorDataset>(images.unsqueeze(1),
                                                         labels.to(torch::kLong));
  };
  for (const char* f : {"train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz",
                        "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"}) {
    if (!fs::exists(root / f)) {
      throw fabric::Error("Fashion-MNIST not found: " + (root / f).string() +
                          " is missing (install the Debian package dataset-fashion-mnist with "
                          "tools/setup.sh, or set data.root)");
    }
  }
  return {split("train"), split("t10k"), "real"};
}

bool has_cifar10(const fs::path& root) {
  const fs::path dir = cifar_dir(root);
  for (const char* f : kCifarFiles)
    if (!fs::exists(dir / f)) return false;
  return true;
}

ImageSplits load_cifar10(const fs::path& root) {
  const fs::path dir = cifar_dir(root);
  auto read = [&](std::vector<std::string> names) {
    std::string bytes;
    for (const auto& name : names) {
      std::ifstream in(dir / name, std::ios::binary);
      if (!in) throw fabric::Error("CIFAR-10: cannot read " + (dir / name).string());
      std::string file((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      if (file.empty() || file.size() % kCifarRecord != 0) {
        throw fabric::Error("CIFAR-10: " + (dir / name).string() + " has " +
                            std::to_string(file.size()) +
                            " bytes, not a multiple of the 3073-byte record");
      }
      bytes += file;
    }
    const int64_t n = static_cast<int64_t>(bytes.size()) / kCifarRecord;
    auto raw = torch::from_blob(bytes.data(), {n, kCifarRecord}, torch::kUInt8).clone();
    auto labels = raw.select(1, 0).to(torch::kLong);
    if (labels.max().item<int64_t>() > 9)
      throw fabric::Error("CIFAR-10: label out of range in " + dir.string());
    auto images = raw.slice(1, 1).reshape({n, 3, 32, 32}).contiguous();
    return std::make_shared<const fabric::TensorDataset>(images, labels);
  };
  return {read({kCifarFiles[0], kCifarFiles[1], kCifarFiles[2], kCifarFiles[3], kCifarFiles[4]}),
          read({kCifarFiles[5]}), "real"};
}

std::string download_cifar10(const fs::path& root) {
  std::error_code ec;
  fs::create_directories(root, ec);
  if (ec) return "cannot create " + root.string() + ": " + ec.message();
  const fs::path archive = root / "cifar-10-binary.tar.gz";
  const std::string url = "https://www.cs.toronto.edu/~kriz/cifar-10-binary.tar.gz";
  const std::string cmd = "curl -fsSL --connect-timeout 10 --max-time 900 -o " +
                          shell_quote(archive.string()) + " " + url + " 2>/dev/null && tar -xzf " +
                          shell_quote(archive.string()) + " -C " + shell_quote(root.string());
  const int rc = std::system(cmd.c_str());
  fs::remove(archive, ec);
  if (rc != 0) {
    const int status = WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
    return "downloading " + url + " failed (curl/tar exit status " + std::to_string(status) +
           (status == 6 ? ": could not resolve host, offline?" : "") + ")";
  }
  if (!has_cifar10(root)) return "the archive from " + url + " did not contain the binary batches";
  return "";
}

ImageSplits synthetic_cifar10(int64_t train_size, int64_t test_size) {
  at::Generator gen = at::detail::createCPUGenerator(20261121);
  // Ten class templates: random 4x4 color patterns upsampled to 32x32.
  auto templates = torch::rand({10, 3, 4, 4}, gen).mul(200).add(28);
  templates = templates.repeat_interleave(8, 2).repeat_interleave(8, 3);  // nearest upsampling
  auto make = [&](int64_t n) {
    auto labels = torch::randint(0, 10, {n}, gen, torch::kLong);
    auto noise = torch::randn({n, 3, 32, 32}, gen).mul(48);
    auto images = (templates.index_select(0, labels) + noise).clamp(0, 255).to(torch::kUInt8);
    return std::make_shared<const fabric::TensorDataset>(images, labels);
  };
  auto train = make(train_size);
  auto test = make(test_size);
  return {train, test, "synthetic"};
}

}  // namespace examples
