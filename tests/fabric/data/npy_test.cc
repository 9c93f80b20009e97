// .npy / .npz reading (fabric/data/npy.h) against files written by NumPy itself (the setup's
// Python): every supported dtype in C and Fortran order and both byte orders equals the values
// NumPy wrote; .npz stored and compressed; the tensor is a private mapping (writes never reach the
// file); every bad input is one line naming the file. Training on .npy data with exact resume:
// tests/integration/image_classifier_test.
#include "fabric/data/npy.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <torch/types.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>

#include "fabric/core/error.h"
#include "tests/run_command.h"

namespace fs = std::filesystem;

namespace {

class NpyTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    std::string tmpl = (fs::path(::testing::TempDir()) / "npy_XXXXXX").string();
    dir_ = mkdtemp(tmpl.data());
    // Each array a.npy beside a.f64: its values in C order as little-endian float64 (complex:
    // real and imaginary parts interleaved), the reference the reader is compared with.
    const std::string program = R"(
import sys, numpy as np
d = sys.argv[1]
rng = np.random.default_rng(0)
def ref(name, a):
    v = np.ascontiguousarray(a)
    v = v.view(v.real.dtype).reshape(-1) if np.iscomplexobj(v) else v.reshape(-1)
    v.astype('<f8').tofile(f'{d}/{name}.f64')
def save(name, a):
    np.save(f'{d}/{name}.npy', a)
    ref(name, a)
for t in ['?', 'i1', 'u1', 'i2', 'u2', 'i4', 'u4', 'i8', 'f2', 'f4', 'f8', 'c8', 'c16']:
    a = (rng.standard_normal((5, 3, 2)) * 100)
    a = (a > 0) if t == '?' else (np.abs(a) if t[0] == 'u' else a)
    a = a.astype(t) if t[0] != 'c' else (a + 1j * a[::-1]).astype(t)
    save(f'c_{t}', a)
    save(f'f_{t}', np.asfortranarray(a))
    if t not in ('?', 'i1', 'u1'):
        save(f'be_{t}', a.astype(a.dtype.newbyteorder('>')))
save('scalar', np.array(3.5, dtype='f4'))
save('vector', np.arange(7, dtype='i8'))
save('empty', np.zeros((0, 4), dtype='f4'))
x, y = rng.standard_normal((6, 4)).astype('f4'), np.arange(6, dtype='u1')
np.savez(f'{d}/stored.npz', x=x, y=y)
np.savez_compressed(f'{d}/deflated.npz', x=x, y=y)
ref('npz_x', x); ref('npz_y', y)
np.save(f'{d}/objects.npy', np.array([{'a': 1}, None], dtype=object), allow_pickle=True)
np.save(f'{d}/records.npy', np.zeros(3, dtype=[('a', 'f4'), ('b', 'i4')]))
np.save(f'{d}/u64.npy', np.arange(3, dtype='u8'))
np.save(f'{d}/strings.npy', np.array(['ab', 'c']))
b = open(f'{d}/c_f4.npy', 'rb').read()
open(f'{d}/truncated.npy', 'wb').write(b[:-5])
open(f'{d}/notnumpy.npy', 'wb').write(b'PK\x03\x04 not an array')
z = open(f'{d}/deflated.npz', 'rb').read()
open(f'{d}/cut.npz', 'wb').write(z[:len(z) // 2])
)";
    std::ofstream(dir_ / "write.py") << program;
    const auto r = fabric::testing::run_command(fabric::testing::python_interpreter() + " " +
                                                (dir_ / "write.py").string() + " " + dir_.string());
    ASSERT_EQ(r.code, 0) << r.out;
  }
  static void TearDownTestSuite() { fs::remove_all(dir_); }

  static torch::Tensor reference(const std::string& name) {
    std::ifstream in(dir_ / (name + ".f64"), std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), {});
    return torch::from_blob(bytes.data(), {static_cast<int64_t>(bytes.size() / 8)}, torch::kDouble)
        .clone();
  }
  static torch::Tensor values(const torch::Tensor& t) {
    auto c = t.contiguous();
    if (c.is_complex()) c = torch::view_as_real(c);
    return c.to(torch::kDouble).reshape(-1);
  }
  static std::string path(const std::string& name) { return (dir_ / name).string(); }
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

TEST_F(NpyTest, EveryDtypeOrderAndByteOrderHasNumPysValues) {
  const std::map<std::string, c10::ScalarType> expected = {
      {"?", torch::kBool},           {"i1", torch::kInt8},   {"u1", torch::kUInt8},
      {"i2", torch::kInt16},         {"u2", torch::kInt32},  {"i4", torch::kInt32},
      {"u4", torch::kInt64},         {"i8", torch::kInt64},  {"f2", torch::kHalf},
      {"f4", torch::kFloat},         {"f8", torch::kDouble}, {"c8", torch::kComplexFloat},
      {"c16", torch::kComplexDouble}};
  int checked = 0;
  for (const auto& [t, type] : expected) {
    for (const std::string prefix : {"c_", "f_", "be_"}) {
      const std::string name = prefix + t;
      if (!fs::exists(dir_ / (name + ".npy"))) continue;
      const torch::Tensor a = fabric::load_npy(path(name + ".npy"));
      EXPECT_EQ(a.scalar_type(), type) << name;
      EXPECT_EQ(a.sizes(), torch::IntArrayRef({5, 3, 2})) << name;
      EXPECT_TRUE(torch::equal(values(a), reference(name))) << name;
      EXPECT_EQ(a.is_contiguous(), prefix != "f_") << name;  // Fortran: a strided view
      ++checked;
    }
  }
  EXPECT_EQ(checked, 13 * 2 + 10);
  EXPECT_EQ(fabric::load_npy(path("scalar.npy")).dim(), 0);
  EXPECT_TRUE(torch::equal(values(fabric::load_npy(path("vector.npy"))), reference("vector")));
  EXPECT_EQ(fabric::load_npy(path("empty.npy")).sizes(), torch::IntArrayRef({0, 4}));
}

TEST_F(NpyTest, NpzMembersStoredAndCompressed) {
  for (const std::string file : {"stored.npz", "deflated.npz"}) {
    const auto arrays = fabric::load_npz(path(file));
    ASSERT_EQ(arrays.size(), 2u) << file;
    EXPECT_TRUE(torch::equal(values(arrays.at("x")), reference("npz_x"))) << file;
    EXPECT_TRUE(torch::equal(values(arrays.at("y")), reference("npz_y"))) << file;
  }
}

TEST_F(NpyTest, WritesToTheTensorNeverReachTheFile) {
  torch::Tensor a = fabric::load_npy(path("c_f4.npy"));
  a.fill_(7.0f);
  EXPECT_TRUE(torch::equal(values(fabric::load_npy(path("c_f4.npy"))), reference("c_f4")));
}

TEST_F(NpyTest, BadFilesAreOneLineErrorsNamingTheFile) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"objects.npy",
       ": holds Python objects (dtype object, pickled), which cannot be read without running "
       "code; save a numeric array, e.g. np.save(f, a.astype(np.float32))"},
      {"records.npy",
       ": a structured array (record dtype) cannot be read; save each field as its own numeric "
       "array"},
      {"u64.npy", ": dtype 'u8' is not supported; convert it with a.astype(np.int64)"},
      {"strings.npy", ": dtype 'U2' is not supported (numbers and bool only)"},
      {"truncated.npy",
       ": truncated: the header's shape needs 120 bytes of data, the file has 115"},
      {"notnumpy.npy", ": not a .npy file (no \\x93NUMPY magic)"},
      {"missing.npy", ": cannot open: No such file or directory"},
  };
  for (const auto& [file, message] : cases)
    EXPECT_EQ(error_of([&] { fabric::load_npy(path(file)); }), path(file) + message) << file;
  const std::string cut = error_of([&] { fabric::load_npz(path("cut.npz")); });
  EXPECT_EQ(cut.rfind(path("cut.npz") + ": not a valid .npz (", 0), 0u) << cut;
  EXPECT_EQ(cut.find('\n'), std::string::npos);
}

TEST_F(NpyTest, DatasetRowsAndLabels) {
  const auto arrays = fabric::load_npz(path("stored.npz"));
  fabric::NpyDataset data(arrays.at("x"), arrays.at("y"), "x", "y");
  EXPECT_EQ(data.size(), 6);
  const fabric::Batch b = data.get_batch({4, 1});
  EXPECT_EQ(b.target.scalar_type(), torch::kInt64);  // uint8 labels, delivered as class indices
  EXPECT_EQ(b.target[0].item<int64_t>(), 4);
  EXPECT_TRUE(torch::equal(b.data[1], arrays.at("x")[1]));
  EXPECT_EQ(error_of([&] {
              fabric::NpyDataset(arrays.at("x"), arrays.at("y").narrow(0, 0, 5), "x.npy", "y.npy");
            }),
            "x.npy has 6 rows but y.npy has 5");
}

// Random damage to a valid file (flipped bytes, cut lengths) is an error or a valid array, never a
// crash: a short deterministic stand-in for the fuzz target (tests/fuzz).
TEST_F(NpyTest, DamagedBytesNeverCrash) {
  std::ifstream in(dir_ / "c_f8.npy", std::ios::binary);
  const std::string good((std::istreambuf_iterator<char>(in)), {});
  std::mt19937 rng(1);
  int errors = 0;
  for (int trial = 0; trial < 2000; ++trial) {
    std::string bad = good;
    const size_t cut = rng() % (good.size() + 1);
    bad.resize(cut);
    for (int k = 0; k < 3 && !bad.empty(); ++k)
      bad[rng() % std::min<size_t>(bad.size(), 128)] = static_cast<char>(rng());
    auto owner = std::make_shared<std::string>(bad);
    try {
      torch::Tensor t = fabric::parse_npy(owner->data(), owner->size(), "damaged", owner);
      (void)values(t).sum().item<double>();  // every element is readable
    } catch (const fabric::Error&) {
      ++errors;
    }
  }
  EXPECT_GT(errors, 1000);
}

}  // namespace
