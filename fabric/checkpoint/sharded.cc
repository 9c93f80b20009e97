// Sharded checkpoints (sharded.h): pieces and descriptors, the manifest written last, and the
// format's helpers (sharded_detail.h). Reading them back is sharded_read.cc.
#include "fabric/checkpoint/sharded.h"

#include <torch/types.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "fabric/checkpoint/archive.h"
#include "fabric/checkpoint/sharded_detail.h"
#include "fabric/core/atomic_file.h"
#include "fabric/core/error.h"
#include "fabric/core/files.h"

namespace fabric {
namespace fs = std::filesystem;

namespace sharded_detail {

bool is_marked(const c10::IValue& v, const char* key) {
  if (!v.isGenericDict()) return false;
  const Dict d = v.toGenericDict();
  return d.keyType()->kind() == c10::TypeKind::StringType && d.contains(key);
}

std::string escape(const std::string& key) {
  std::string out;
  for (char c : key) {
    if (c == '%')
      out += "%25";
    else if (c == '/')
      out += "%2F";
    else
      out += c;
  }
  return out;
}

std::string key_text(const c10::IValue& key) {
  if (key.isString()) return escape(key.toStringRef());
  if (key.isInt()) return std::to_string(key.toInt());
  return "?";
}

std::string join_path(const std::string& at, const std::string& key) {
  return at.empty() ? key : at + "/" + key;
}

std::optional<c10::IValue> transform(const c10::IValue& v, const std::string& at,
                                     const Replace& replace) {
  if (auto r = replace(v, at)) return r;
  if (v.isGenericDict()) {
    const Dict d = v.toGenericDict();
    std::vector<std::pair<c10::IValue, c10::IValue>> items;
    bool changed = false;
    for (const auto& e : d) {
      auto r = transform(e.value(), join_path(at, key_text(e.key())), replace);
      changed = changed || r.has_value();
      items.emplace_back(e.key(), r ? *r : e.value());
    }
    if (!changed) return std::nullopt;
    Dict out(d.keyType(), c10::AnyType::get());
    for (auto& [k, value] : items) out.insert(k, value);
    return c10::IValue(out);
  }
  if (v.isList()) {
    const auto list = v.toList();
    c10::impl::GenericList out(c10::AnyType::get());
    bool changed = false;
    for (size_t i = 0; i < list.size(); ++i) {
      auto r = transform(list.get(i), join_path(at, std::to_string(i)), replace);
      changed = changed || r.has_value();
      out.push_back(r ? *r : list.get(i));
    }
    if (!changed) return std::nullopt;
    return c10::IValue(out);
  }
  if (v.isTuple()) {
    const auto& elements = v.toTupleRef().elements();
    std::vector<c10::IValue> out;
    bool changed = false;
    for (size_t i = 0; i < elements.size(); ++i) {
      auto r = transform(elements[i], join_path(at, std::to_string(i)), replace);
      changed = changed || r.has_value();
      out.push_back(r ? *r : elements[i]);
    }
    if (!changed) return std::nullopt;
    return c10::IValue(c10::ivalue::Tuple::create(std::move(out)));
  }
  return std::nullopt;
}

c10::impl::GenericList int_list(at::IntArrayRef values) {
  c10::impl::GenericList out(c10::AnyType::get());
  for (int64_t v : values) out.push_back(v);
  return out;
}

std::vector<int64_t> ints_of(const c10::IValue& v, const std::string& what) {
  if (!v.isList()) throw Error(what);
  std::vector<int64_t> out;
  const auto list = v.toList();
  for (size_t i = 0; i < list.size(); ++i) {
    const c10::IValue x = list.get(i);
    if (!x.isInt()) throw Error(what);
    out.push_back(x.toInt());
  }
  return out;
}

torch::ScalarType dtype_named(const std::string& name, const std::string& what) {
  for (torch::ScalarType t : {torch::kFloat, torch::kDouble, torch::kHalf, torch::kBFloat16,
                              torch::kLong, torch::kInt, torch::kShort, torch::kChar, torch::kByte,
                              torch::kBool, torch::kComplexFloat, torch::kComplexDouble})
    if (name == c10::toString(t)) return t;
  throw Error(what + ": unknown dtype '" + name + "'");
}

int64_t dense_extent(const std::vector<int64_t>& sizes, const std::vector<int64_t>& strides) {
  if (sizes.size() != strides.size()) return -1;
  std::vector<size_t> order(sizes.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(),
            [&](size_t a, size_t b) { return strides[a] < strides[b]; });
  int64_t expected = 1;
  for (size_t i : order) {
    if (sizes[i] < 0) return -1;
    if (sizes[i] == 1) continue;
    if (strides[i] != expected) return -1;
    expected *= sizes[i];
  }
  int64_t numel = 1;
  for (int64_t s : sizes) numel *= s;
  return numel;
}

std::string read_text(const fs::path& path) {
  require_regular_file(path);
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(path.string() + ": cannot open");
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace sharded_detail

std::string shard_file_name(int64_t rank, int64_t world_size) {
  char name[64];
  std::snprintf(name, sizeof(name), "shard-%05lld-of-%05lld.pt", static_cast<long long>(rank),
                static_cast<long long>(world_size));
  return name;
}

namespace sharded_detail {

Dict layout_dict(const PieceLayout& layout) {
  Dict d = new_dict();
  d.insert("shape", int_list(layout.shape));
  d.insert("permute", int_list(layout.permute));
  return d;
}

std::optional<PieceLayout> layout_of(const Dict& d, const std::string& what) {
  if (!d.contains("layout")) return std::nullopt;
  const c10::IValue& v = d.at("layout");
  if (!is_marked(v, "shape") || !v.toGenericDict().contains("permute"))
    throw Error(what + ": malformed layout");
  PieceLayout layout;
  layout.shape = ints_of(v.toGenericDict().at("shape"), what + ": malformed layout shape");
  layout.permute = ints_of(v.toGenericDict().at("permute"), what + ": malformed layout permute");
  return layout;
}

}  // namespace sharded_detail

using namespace sharded_detail;  // NOLINT(build/namespaces): this file's own helpers

c10::IValue tensor_piece(at::IntArrayRef sizes, at::IntArrayRef strides, int64_t offset,
                         const torch::Tensor& values, const std::optional<PieceLayout>& layout) {
  Dict d = new_dict();
  d.insert(kPieceKey, true);
  d.insert("shape", int_list(sizes));
  d.insert("strides", int_list(strides));
  d.insert("offset", offset);
  d.insert("values", values.detach().reshape(-1));
  if (layout) d.insert("layout", layout_dict(*layout));
  return d;
}

ShardedParts split_pieces(const c10::IValue& contents, const std::string& save_id) {
  Dict pieces = new_dict();
  auto replaced = transform(contents, "", [&](const c10::IValue& v, const std::string& at) {
    if (!is_marked(v, kPieceKey)) return std::optional<c10::IValue>();
    const Dict piece = v.toGenericDict();
    const torch::Tensor values = piece.at("values").toTensor();
    if (values.numel() > 0) {
      Dict p = new_dict();
      p.insert("offset", piece.at("offset"));
      p.insert("values", values);
      pieces.insert(at, p);
    }
    Dict descriptor = new_dict();
    descriptor.insert(kDescriptorKey, at);
    descriptor.insert("shape", piece.at("shape"));
    descriptor.insert("strides", piece.at("strides"));
    descriptor.insert("dtype", std::string(c10::toString(values.scalar_type())));
    if (piece.contains("layout")) descriptor.insert("layout", piece.at("layout"));
    return std::optional<c10::IValue>(descriptor);
  });
  Dict shard = new_dict();
  shard.insert("pieces", pieces);
  c10::IValue common = replaced ? *replaced : contents;
  if (!save_id.empty() && common.isGenericDict()) {
    Dict top = common.toGenericDict().copy();  // contents' own dict stays as it was
    top.insert(kSaveIdKey, save_id);
    shard.insert(kSaveIdKey, save_id);
    common = top;
  }
  return {common, shard};
}

std::optional<TensorPiece> as_tensor_piece(const c10::IValue& value) {
  if (!is_marked(value, kPieceKey)) return std::nullopt;
  const Dict d = value.toGenericDict();
  TensorPiece p;
  p.sizes = ints_of(d.at("shape"), "malformed piece");
  p.strides = ints_of(d.at("strides"), "malformed piece");
  p.offset = d.at("offset").toInt();
  p.values = d.at("values").toTensor();
  p.layout = layout_of(d, "malformed piece");
  return p;
}

std::string sharded_path(const std::vector<std::string>& keys) {
  std::string out;
  for (const auto& k : keys) out = join_path(out, escape(k));
  return out;
}

void write_manifest(const fs::path& dir, int64_t world_size,
                    const std::vector<std::string>& files) {
  std::ostringstream json;
  json << "{\n  \"format\": \"" << kFormat
       << "\",\n  \"version\": 2,\n  \"world_size\": " << world_size << ",\n  \"files\": {";
  for (size_t i = 0; i < files.size(); ++i) {
    std::error_code ec;
    const auto bytes = fs::file_size(dir / files[i], ec);
    if (ec)
      throw Error("cannot write " + (dir / kShardedManifest).string() + ": " +
                  (dir / files[i]).string() + ": " + ec.message());
    json << (i ? ",\n" : "\n") << "    \"" << files[i] << "\": " << bytes;
  }
  json << "\n  }\n}\n";
  write_file_atomically(dir / kShardedManifest, json.str());
}

bool is_sharded_checkpoint(const fs::path& path) {
  std::error_code ec;
  return fs::is_directory(path, ec) && fs::is_regular_file(path / kShardedManifest, ec);
}

}  // namespace fabric
