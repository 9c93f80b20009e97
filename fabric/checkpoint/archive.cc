#include "fabric/checkpoint/archive.h"

#include <caffe2/serialize/inline_container.h>
#include <torch/csrc/jit/serialization/pickler.h>
#include <torch/csrc/jit/serialization/pickler_helper.h>

#include <cerrno>
#include <cstring>
#include <functional>
#include <optional>
#include <string_view>
#include <stdexcept>

#include "fabric/checkpoint/torch_pickle.h"
#include "fabric/core/atomic_file.h"
#include "fabric/core/error.h"

namespace fabric {

c10::impl::GenericDict new_dict() {
  return c10::impl::GenericDict(c10::StringType::get(), c10::AnyType::get());
}

namespace fs = std::filesystem;

namespace {

// CPU, contiguous copies of every tensor in `value` (the pickler writes storages as they are).
c10::IValue to_cpu(const c10::IValue& value) {
  if (value.isTensor()) {
    const auto& t = value.toTensor();
    return t.defined() ? c10::IValue(t.detach().cpu().contiguous()) : value;
  }
  if (value.isGenericDict()) {
    const auto dict = value.toGenericDict();
    c10::impl::GenericDict out(dict.keyType(), dict.valueType());
    for (const auto& entry : dict) out.insert(entry.key(), to_cpu(entry.value()));
    return out;
  }
  if (value.isList()) {
    const auto list = value.toList();
    c10::impl::GenericList out(list.elementType());
    for (const auto& item : list) out.push_back(to_cpu(item));
    return out;
  }
  if (value.isTuple()) {
    std::vector<c10::IValue> items;
    for (const auto& item : value.toTupleRef().elements()) items.push_back(to_cpu(item));
    return c10::ivalue::Tuple::create(std::move(items));
  }
  return value;
}

}  // namespace

namespace {

// Writes `value` in torch.save's layout through `sink` (bytes in order, as they are made).
void write_archive(const c10::IValue& value, const std::function<void(const void*, size_t)>& sink) {
  // torch.save's layout: archive/data.pkl (pickle protocol 2, tensors as persistent ids) and
  // archive/data/<key> (raw storages). Unlike torch::pickle_save, aggregates are not tagged with
  // torch.jit._pickle.restore_type_tag, which torch.load(weights_only=True) refuses.
  std::string pickle;
  torch::jit::Pickler pickler([&](const char* data, size_t n) { pickle.append(data, n); },
                              /*tensor_table=*/nullptr, /*type_renamer=*/nullptr,
                              /*memoized_class_types=*/nullptr, /*get_tensor_id=*/nullptr,
                              /*tag_aggregates=*/false);
  pickler.protocol();
  pickler.pushIValue(to_cpu(value));
  pickler.stop();
  caffe2::serialize::PyTorchStreamWriter writer([&](const void* data, size_t n) {
    sink(data, n);
    return n;
  });
  writer.writeRecord("data.pkl", pickle.data(), pickle.size());
  writer.writeRecord("byteorder", "little", 6);
  const auto& tensors = pickler.tensorData();
  for (size_t i = 0; i < tensors.size(); ++i) {
    const auto data = torch::jit::getWriteableTensorData(tensors[i]);
    writer.writeRecord("data/" + std::to_string(i), data.data(), data.sizeInBytes());
  }
  writer.writeEndOfFile();
}

}  // namespace

std::string archive_bytes(const c10::IValue& value) {
  std::string archive;
  write_archive(value, [&](const void* data, size_t n) {
    archive.append(static_cast<const char*>(data), n);
  });
  return archive;
}

void save_archive(const fs::path& path, const c10::IValue& value) {
  // Streamed to the file: the archive is never whole in memory. A failed write (fabric::Error
  // from the file) ends the writer; nothing else is written.
  AtomicFile file(path);
  std::optional<Error> failed;
  try {
    write_archive(value, [&](const void* data, size_t n) {
      if (failed) return;
      try {
        file.write(std::string_view(static_cast<const char*>(data), n));
      } catch (const Error& e) {
        failed = e;
      }
    });
  } catch (const std::exception& e) {
    if (failed) throw *failed;
    std::string why = e.what();
    throw Error("cannot write " + path.string() + ": " + why.substr(0, why.find('\n')));
  }
  if (failed) throw *failed;
  file.commit();
}

c10::IValue load_archive(const fs::path& path) {
  std::error_code ec;
  if (!fs::is_regular_file(path, ec))
    throw Error(path.string() + ": cannot open (" +
                (fs::exists(path, ec) ? "not a regular file" : std::strerror(ENOENT)) + ")");
  try {
    caffe2::serialize::PyTorchStreamReader reader(path.string());
    auto read = [&](const std::string& name) {
      if (!reader.hasRecord(name)) throw std::runtime_error("has no record " + name);
      auto [data, size] = reader.getRecord(name);
      return std::string(static_cast<const char*>(data.get()), size);
    };
    return internal::read_pickle(read("data.pkl"),
                                 [&](const std::string& key) { return read("data/" + key); });
  } catch (const std::exception& e) {
    std::string why = e.what();
    why = why.substr(0, why.find('\n'));
    // miniz explains at length what a damaged file may be; the first sentence says it.
    if (const size_t cut = why.find(". This is an internal miniz error"); cut != std::string::npos)
      why = why.substr(0, cut);
    throw Error(path.string() + ": not a readable PyTorch file (" + why + ")");
  }
}

}  // namespace fabric
