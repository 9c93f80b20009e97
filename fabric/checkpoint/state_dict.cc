#include "fabric/checkpoint/state_dict.h"

#include <caffe2/serialize/inline_container.h>
#include <torch/csrc/jit/serialization/pickler.h>
#include <torch/csrc/jit/serialization/pickler_helper.h>
#include <torch/torch.h>

#include <map>
#include <sstream>

#include "fabric/checkpoint/torch_pickle.h"
#include "fabric/core/atomic_file.h"
#include "fabric/core/error.h"

namespace fabric {
namespace fs = std::filesystem;

namespace {

std::string shape_of(const torch::Tensor& t) {
  std::ostringstream s;
  s << t.sizes();
  return s.str();
}

std::string join(const std::vector<std::string>& items) {
  std::string out;
  for (const auto& i : items) out += (out.empty() ? "" : ", ") + i;
  return "[" + out + "]";
}

}  // namespace

StateDict state_dict(const torch::nn::Module& module) {
  StateDict out;
  for (const auto& p : module.named_parameters())
    if (p.value().defined()) out.emplace_back(p.key(), p.value().detach());
  for (const auto& b : module.named_buffers())
    if (b.value().defined()) out.emplace_back(b.key(), b.value().detach());
  return out;
}

void save_state_dict(const fs::path& path, const StateDict& tensors) {
  c10::Dict<std::string, torch::Tensor> dict;
  for (const auto& [name, t] : tensors) {
    if (dict.contains(name))
      throw Error("cannot write " + path.string() + ": duplicate name " + name);
    dict.insert(name, t.detach().cpu().contiguous());
  }
  // torch.save's layout: archive/data.pkl (pickle protocol 2, tensors as persistent ids) and
  // archive/data/<key> (raw storages). Unlike torch::pickle_save, aggregates are not tagged with
  // torch.jit._pickle.restore_type_tag, which torch.load(weights_only=True) refuses.
  std::string pickle;
  torch::jit::Pickler pickler([&](const char* data, size_t n) { pickle.append(data, n); },
                              /*tensor_table=*/nullptr, /*type_renamer=*/nullptr,
                              /*memoized_class_types=*/nullptr, /*get_tensor_id=*/nullptr,
                              /*tag_aggregates=*/false);
  pickler.protocol();
  pickler.pushIValue(c10::IValue(dict));
  pickler.stop();
  std::string archive;
  {
    caffe2::serialize::PyTorchStreamWriter writer([&](const void* data, size_t n) {
      archive.append(static_cast<const char*>(data), n);
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
  write_file_atomically(path, archive);
}

StateDict load_state_dict_file(const fs::path& path) {
  if (!fs::exists(path)) throw Error(path.string() + ": cannot open (No such file or directory)");
  try {
    caffe2::serialize::PyTorchStreamReader reader(path.string());
    auto read = [&](const std::string& name) {
      if (!reader.hasRecord(name)) throw std::runtime_error("has no record " + name);
      auto [data, size] = reader.getRecord(name);
      return std::string(static_cast<const char*>(data.get()), size);
    };
    return internal::read_state_dict_pickle(
        read("data.pkl"), [&](const std::string& key) { return read("data/" + key); });
  } catch (const std::exception& e) {
    std::string why = e.what();
    why = why.substr(0, why.find('\n'));
    throw Error(path.string() + ": not a readable PyTorch state dict file (" + why + ")");
  }
}

void load_state_dict(torch::nn::Module& module, const StateDict& tensors,
                     const std::string& source) {
  std::map<std::string, torch::Tensor> given;
  for (const auto& [name, t] : tensors) given[name] = t;
  std::vector<std::string> missing, shapes;
  std::vector<std::pair<torch::Tensor, torch::Tensor>> copies;  // (destination, source)
  for (const auto& [name, target] : state_dict(module)) {
    auto it = given.find(name);
    if (it == given.end()) {
      missing.push_back(name);
      continue;
    }
    if (!it->second.sizes().equals(target.sizes())) {
      shapes.push_back("shape of " + name + " is " + shape_of(it->second) + " in the file, " +
                       shape_of(target) + " in the model");
    } else {
      copies.emplace_back(target, it->second);
    }
    given.erase(it);
  }
  std::vector<std::string> unexpected;
  for (const auto& [name, t] : given) unexpected.push_back(name);
  if (!missing.empty() || !unexpected.empty() || !shapes.empty()) {
    std::string why;
    if (!missing.empty()) why += "missing " + join(missing);
    if (!unexpected.empty())
      why += (why.empty() ? "" : "; ") + std::string("unexpected ") + join(unexpected);
    for (const auto& s : shapes) why += (why.empty() ? "" : "; ") + s;
    throw Error(source + ": does not match the model: " + why);
  }
  torch::NoGradGuard no_grad;
  for (auto& [destination, from] : copies) destination.copy_(from);
}

}  // namespace fabric
