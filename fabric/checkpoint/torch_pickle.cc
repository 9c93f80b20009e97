#include "fabric/checkpoint/torch_pickle.h"

#include <torch/types.h>

#include <cstring>
#include <map>
#include <memory>
#include <stdexcept>

namespace fabric::internal {
namespace {

struct Value;
using Ptr = std::shared_ptr<Value>;

struct Value {
  enum Kind { kNone, kInt, kFloat, kBool, kStr, kTuple, kList, kDict, kGlobal, kTensor, kMark };
  Kind kind = kNone;
  int64_t i = 0;
  double f = 0;
  std::string s;  // string, or "module.name" of a global
  std::vector<Ptr> items;
  std::vector<std::pair<Ptr, Ptr>> entries;
  torch::Tensor tensor;
};

Ptr make(Value::Kind k) {
  auto v = std::make_shared<Value>();
  v->kind = k;
  return v;
}

const std::map<std::string, torch::ScalarType>& storage_types() {
  static const std::map<std::string, torch::ScalarType> types = {
      {"torch.FloatStorage", torch::kFloat}, {"torch.DoubleStorage", torch::kDouble},
      {"torch.HalfStorage", torch::kHalf},   {"torch.BFloat16Storage", torch::kBFloat16},
      {"torch.LongStorage", torch::kLong},   {"torch.IntStorage", torch::kInt},
      {"torch.ShortStorage", torch::kShort}, {"torch.CharStorage", torch::kChar},
      {"torch.ByteStorage", torch::kByte},   {"torch.BoolStorage", torch::kBool}};
  return types;
}

bool allowed_global(const std::string& name) {
  return name == "collections.OrderedDict" || name == "torch._utils._rebuild_tensor_v2" ||
         name == "torch._utils._rebuild_parameter" || storage_types().count(name) > 0;
}

class Reader {
 public:
  Reader(const std::string& data, const std::function<c10::Storage(const std::string&)>& record,
         bool metadata_only)
      : d_(data), record_(record), metadata_only_(metadata_only) {}

  Ptr run() {
    for (;;) {
      const auto op = static_cast<unsigned char>(byte());
      switch (op) {
        case 0x80:
          byte();
          break;  // PROTO
        case 0x95:
          take(8);
          break;  // FRAME
        case '.':
          return pop();  // STOP
        case '(':
          stack_.push_back(make(Value::kMark));
          break;
        case ')':
          stack_.push_back(make(Value::kTuple));
          break;
        case ']':
          stack_.push_back(make(Value::kList));
          break;
        case '}':
          stack_.push_back(make(Value::kDict));
          break;
        case 'N':
          stack_.push_back(make(Value::kNone));
          break;
        case 0x88:
        case 0x89: {
          auto v = make(Value::kBool);
          v->i = op == 0x88;
          stack_.push_back(v);
          break;
        }
        case 'K':
          push_int(static_cast<unsigned char>(byte()));
          break;
        case 'M':
          push_int(static_cast<int64_t>(uint_le(2)));
          break;
        case 'J':
          push_int(static_cast<int32_t>(uint_le(4)));
          break;
        case 0x8a: {  // LONG1
          const auto n = static_cast<unsigned char>(byte());
          if (n > 8) throw std::runtime_error("integer too large");
          const std::string b = take(n);
          int64_t v = 0;
          for (size_t k = 0; k < n; ++k)
            v |= static_cast<int64_t>(static_cast<unsigned char>(b[k])) << (8 * k);
          if (n > 0 && n < 8 && (static_cast<unsigned char>(b[n - 1]) & 0x80))
            v -= int64_t{1} << (8 * n);
          push_int(v);
          break;
        }
        case 'G': {  // BINFLOAT, big endian
          std::string b = take(8);
          std::reverse(b.begin(), b.end());
          auto v = make(Value::kFloat);
          std::memcpy(&v->f, b.data(), 8);
          stack_.push_back(v);
          break;
        }
        case 'X':  // BINUNICODE
        case 'T':  // BINSTRING
          push_str(take(uint_le(4)));
          break;
        case 0x8c:  // SHORT_BINUNICODE
        case 'U':   // SHORT_BINSTRING
          push_str(take(static_cast<unsigned char>(byte())));
          break;
        case 'q':
          memo_[static_cast<unsigned char>(byte())] = top();
          break;
        case 'r':
          memo_[uint_le(4)] = top();
          break;
        case 0x94:
          memo_[memo_.size()] = top();
          break;  // MEMOIZE
        case 'h':
          stack_.push_back(memo(static_cast<unsigned char>(byte())));
          break;
        case 'j':
          stack_.push_back(memo(uint_le(4)));
          break;
        case 'c': {  // GLOBAL
          std::string module = line(), name = line();
          const std::string full = module + "." + name;
          if (!allowed_global(full))
            throw std::runtime_error(
                "refers to " + full +
                ", which plain data never needs (not loaded: no code from files is run)");
          auto v = make(Value::kGlobal);
          v->s = full;
          stack_.push_back(v);
          break;
        }
        case 't': {
          auto v = make(Value::kTuple);
          v->items = since_mark();
          stack_.push_back(v);
          break;
        }
        case 0x85:
        case 0x86:
        case 0x87: {
          auto v = make(Value::kTuple);
          v->items.resize(op - 0x84);
          for (size_t k = v->items.size(); k-- > 0;) v->items[k] = pop();
          stack_.push_back(v);
          break;
        }
        case 'a': {
          auto item = pop();
          expect(top(), Value::kList, "APPEND")->items.push_back(item);
          break;
        }
        case 'e': {
          auto items = since_mark();
          auto list = expect(top(), Value::kList, "APPENDS");
          list->items.insert(list->items.end(), items.begin(), items.end());
          break;
        }
        case 's': {
          auto value = pop();
          auto key = pop();
          expect(top(), Value::kDict, "SETITEM")->entries.emplace_back(key, value);
          break;
        }
        case 'u': {
          auto items = since_mark();
          auto dict = expect(top(), Value::kDict, "SETITEMS");
          for (size_t k = 0; k + 1 < items.size(); k += 2)
            dict->entries.emplace_back(items[k], items[k + 1]);
          break;
        }
        case 'b':
          pop();
          break;  // BUILD: object state (OrderedDict._metadata): not needed
        case 'Q':
          stack_.push_back(storage(pop()));
          break;  // BINPERSID
        case 'R': {
          auto args = pop();
          auto callable = pop();
          stack_.push_back(reduce(callable, args));
          break;
        }
        default: {
          char hex[8];
          std::snprintf(hex, sizeof(hex), "0x%02x", op);
          throw std::runtime_error(std::string("unsupported pickle opcode ") + hex);
        }
      }
    }
  }

 private:
  char byte() {
    if (pos_ >= d_.size()) throw std::runtime_error("truncated pickle");
    return d_[pos_++];
  }
  std::string take(size_t n) {
    if (n > d_.size() - pos_) throw std::runtime_error("truncated pickle");
    std::string out = d_.substr(pos_, n);
    pos_ += n;
    return out;
  }
  uint64_t uint_le(size_t n) {
    const std::string b = take(n);
    uint64_t v = 0;
    for (size_t k = 0; k < n; ++k)
      v |= static_cast<uint64_t>(static_cast<unsigned char>(b[k])) << (8 * k);
    return v;
  }
  std::string line() {
    const size_t end = d_.find('\n', pos_);
    if (end == std::string::npos) throw std::runtime_error("truncated pickle");
    std::string out = d_.substr(pos_, end - pos_);
    pos_ = end + 1;
    return out;
  }
  void push_int(int64_t v) {
    auto p = make(Value::kInt);
    p->i = v;
    stack_.push_back(p);
  }
  void push_str(std::string s) {
    auto p = make(Value::kStr);
    p->s = std::move(s);
    stack_.push_back(p);
  }
  Ptr pop() {
    if (stack_.empty()) throw std::runtime_error("malformed pickle (empty stack)");
    Ptr v = stack_.back();
    stack_.pop_back();
    return v;
  }
  Ptr top() {
    if (stack_.empty()) throw std::runtime_error("malformed pickle (empty stack)");
    return stack_.back();
  }
  Ptr memo(uint64_t k) {
    auto it = memo_.find(k);
    if (it == memo_.end()) throw std::runtime_error("malformed pickle (unknown memo entry)");
    return it->second;
  }
  static Ptr expect(const Ptr& v, Value::Kind k, const char* op) {
    if (v->kind != k)
      throw std::runtime_error(std::string("malformed pickle (") + op + " on the wrong type)");
    return v;
  }
  std::vector<Ptr> since_mark() {
    std::vector<Ptr> items;
    for (;;) {
      Ptr v = pop();
      if (v->kind == Value::kMark) break;
      items.push_back(v);
    }
    std::reverse(items.begin(), items.end());
    return items;
  }
  static std::vector<int64_t> ints(const Ptr& v) {
    std::vector<int64_t> out;
    for (const auto& item : expect(v, Value::kTuple, "size")->items) {
      if (item->kind != Value::kInt) throw std::runtime_error("malformed tensor shape");
      out.push_back(item->i);
    }
    return out;
  }
  // ('storage', <storage type>, key, location, numel) → flat CPU tensor.
  Ptr storage(const Ptr& pid) {
    const auto& t = expect(pid, Value::kTuple, "persistent id")->items;
    if (t.size() != 5 || t[0]->kind != Value::kStr || t[0]->s != "storage" ||
        t[1]->kind != Value::kGlobal || t[2]->kind != Value::kStr || t[4]->kind != Value::kInt)
      throw std::runtime_error("unsupported persistent id");
    const auto type = storage_types().find(t[1]->s);
    if (type == storage_types().end()) throw std::runtime_error("unsupported storage " + t[1]->s);
    c10::Storage bytes = record_(t[2]->s);
    const int64_t numel = t[4]->i;
    if (bytes.nbytes() != static_cast<size_t>(numel) * c10::elementSize(type->second))
      throw std::runtime_error(
          "storage " + t[2]->s + " has " + std::to_string(bytes.nbytes()) + " bytes, expected " +
          std::to_string(numel * static_cast<int64_t>(c10::elementSize(type->second))));
    auto v = make(Value::kTensor);
    // The record's memory itself (no copy).
    v->tensor = torch::empty({0}, type->second).set_(std::move(bytes), 0, {numel}, {1});
    return v;
  }
  Ptr reduce(const Ptr& callable, const Ptr& args) {
    expect(callable, Value::kGlobal, "REDUCE");
    const auto& a = expect(args, Value::kTuple, "REDUCE arguments")->items;
    if (callable->s == "collections.OrderedDict") return make(Value::kDict);
    if (callable->s == "torch._utils._rebuild_parameter") {
      if (a.empty() || a[0]->kind != Value::kTensor)
        throw std::runtime_error("malformed parameter");
      return a[0];
    }
    if (callable->s == "torch._utils._rebuild_tensor_v2") {
      if (a.size() < 4 || a[0]->kind != Value::kTensor || a[1]->kind != Value::kInt)
        throw std::runtime_error("malformed tensor");
      const auto size = ints(a[2]), stride = ints(a[3]);
      if (size.size() != stride.size() || a[1]->i < 0)
        throw std::runtime_error("malformed tensor shape");
      // The elements of the storage the view reaches, [offset, offset + span): checked without
      // overflow (a damaged file's sizes near 2^63 must not wrap past the check).
      int64_t span = 1, numel = 1;
      for (size_t k = 0; k < size.size(); ++k) {
        if (size[k] < 0 || stride[k] < 0) throw std::runtime_error("malformed tensor shape");
        int64_t reach = 0;
        if (size[k] > 0 && (__builtin_mul_overflow(size[k] - 1, stride[k], &reach) ||
                            __builtin_add_overflow(span, reach, &span)))
          throw std::runtime_error("tensor shape exceeds its storage");
        if (__builtin_mul_overflow(numel, size[k], &numel))
          throw std::runtime_error("malformed tensor shape");
      }
      if (numel == 0) span = 0;
      const int64_t storage = a[0]->tensor.numel();
      if (span > 0 && (a[1]->i > storage || span > storage - a[1]->i))
        throw std::runtime_error("tensor shape exceeds its storage");
      auto v = make(Value::kTensor);
      // A view of at least half as many elements as its storage keeps the record's memory (no
      // copy: loading a large state does not hold it twice; an expand()ed tensor, stride 0, stays
      // a view as torch.load keeps it, not materialised to numel elements); a smaller one is
      // copied, so that a small tensor never keeps a large record alive.
      const torch::Tensor view = a[0]->tensor.as_strided(size, stride, a[1]->i);
      const bool keep = metadata_only_ || numel >= storage - numel;
      v->tensor = keep ? view : view.clone();
      return v;
    }
    throw std::runtime_error("cannot call " + callable->s);
  }

  const std::string& d_;
  const std::function<c10::Storage(const std::string&)>& record_;
  bool metadata_only_;  // storages without memory: never copy a view
  size_t pos_ = 0;
  std::vector<Ptr> stack_;
  std::map<uint64_t, Ptr> memo_;
};

c10::IValue to_ivalue(const Ptr& v, int depth) {
  if (depth > 64) throw std::runtime_error("nested too deeply (over 64 levels)");
  switch (v->kind) {
    case Value::kNone:
      return c10::IValue();
    case Value::kInt:
      return c10::IValue(v->i);
    case Value::kFloat:
      return c10::IValue(v->f);
    case Value::kBool:
      return c10::IValue(v->i != 0);
    case Value::kStr:
      return c10::IValue(v->s);
    case Value::kTensor:
      return c10::IValue(v->tensor);
    case Value::kTuple: {
      std::vector<c10::IValue> items;
      for (const auto& item : v->items) items.push_back(to_ivalue(item, depth + 1));
      return c10::IValue(c10::ivalue::Tuple::create(std::move(items)));
    }
    case Value::kList: {
      c10::impl::GenericList list(c10::AnyType::get());
      for (const auto& item : v->items) list.push_back(to_ivalue(item, depth + 1));
      return c10::IValue(list);
    }
    case Value::kDict: {
      bool strings = true, ints = true;
      for (const auto& entry : v->entries) {
        strings = strings && entry.first->kind == Value::kStr;
        ints = ints && entry.first->kind == Value::kInt;
      }
      if (!strings && !ints)
        throw std::runtime_error("a dict has keys that are not all strings or ints");
      c10::impl::GenericDict dict(
          strings ? c10::TypePtr(c10::StringType::get()) : c10::TypePtr(c10::IntType::get()),
          c10::AnyType::get());
      for (const auto& [key, value] : v->entries)
        dict.insert_or_assign(to_ivalue(key, depth + 1), to_ivalue(value, depth + 1));
      return c10::IValue(dict);
    }
    default:
      throw std::runtime_error("holds a bare " + v->s + " (only data is read)");
  }
}

}  // namespace

c10::IValue read_pickle(const std::string& pickle,
                        const std::function<c10::Storage(const std::string&)>& record,
                        bool metadata_only) {
  Reader reader(pickle, record, metadata_only);
  return to_ivalue(reader.run(), 0);
}

}  // namespace fabric::internal
