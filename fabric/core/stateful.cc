#include "fabric/core/stateful.h"

#include "fabric/core/error.h"

namespace fabric {

c10::impl::GenericDict new_state_dict() {
  return c10::impl::GenericDict(c10::StringType::get(), c10::AnyType::get());
}

std::optional<c10::IValue> optional_state_field(const c10::IValue& saved, const std::string& key,
                                                const std::string& source) {
  if (!saved.isGenericDict()) throw Error(source + ": malformed (not a dict)");
  const c10::impl::GenericDict dict = saved.toGenericDict();
  auto it = dict.find(key);
  if (it == dict.end()) return std::nullopt;
  return it->value();
}

c10::IValue state_field(const c10::IValue& saved, const std::string& key,
                        const std::string& source) {
  auto value = optional_state_field(saved, key, source);
  if (!value) throw Error(source + ": malformed (no \"" + key + "\")");
  return *value;
}

int64_t state_int(const c10::IValue& saved, const std::string& key, const std::string& source) {
  const c10::IValue v = state_field(saved, key, source);
  if (!v.isInt()) throw Error(source + ": malformed (\"" + key + "\" is not an integer)");
  return v.toInt();
}

double state_number(const c10::IValue& saved, const std::string& key, const std::string& source) {
  const c10::IValue v = state_field(saved, key, source);
  if (!v.isDouble() && !v.isInt())
    throw Error(source + ": malformed (\"" + key + "\" is not a number)");
  return v.isDouble() ? v.toDouble() : static_cast<double>(v.toInt());
}

std::string state_type_error(const std::string& source, const std::string& expected,
                             const c10::IValue& value) {
  return source + ": holds a " + value.tagKind() + ", expected " + expected;
}

}  // namespace fabric
