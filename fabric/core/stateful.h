// fabric::Stateful: an object whose state a checkpoint saves and restores under a name
// (CheckpointState::add(name, object)). The data loader, LR schedulers and the GradScaler are
// Stateful; so can be any object of yours:
//
//   struct Counter : fabric::Stateful {
//     int64_t seen = 0;
//     c10::IValue save_state() const override {
//       auto d = fabric::new_state_dict();
//       d.insert("seen", seen);
//       return d;
//     }
//     std::function<void()> prepare_restore(const c10::IValue& saved,
//                                           const std::string& source) override {
//       const int64_t s = fabric::state_int(saved, "seen", source);  // checks, changes nothing
//       return [this, s] { seen = s; };                               // applies
//     }
//   };
//   state.add("counter", counter);
//
// Loading a checkpoint first calls prepare_restore on every entry, then, only if none threw,
// applies them all: a file that does not fit changes nothing.
#ifndef FABRIC_CORE_STATEFUL_H_
#define FABRIC_CORE_STATEFUL_H_

#include <ATen/core/Dict.h>
#include <ATen/core/ivalue.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

namespace fabric {

class Stateful {
 public:
  virtual ~Stateful() = default;

  // The state to save: a dictionary (new_state_dict()) of tensors and plain values (int64_t,
  // double, bool, std::string, lists and dictionaries of them), which torch.save's format and
  // Python's torch.load(weights_only=True) hold.
  virtual c10::IValue save_state() const = 0;

  // Checks `saved` (what save_state() returned, maybe by an older build) without changing the
  // object and returns the function that applies it. Throws fabric::Error "SOURCE: what does not
  // fit" (one line; SOURCE names the file and the entry).
  virtual std::function<void()> prepare_restore(const c10::IValue& saved,
                                                const std::string& source) = 0;

  // prepare_restore, then apply.
  void restore(const c10::IValue& saved, const std::string& source = "state") {
    prepare_restore(saved, source)();
  }
};

// A dictionary from names to any value, as save_state() returns.
c10::impl::GenericDict new_state_dict();

// Reading a saved state; each throws fabric::Error "SOURCE: malformed (...)" when `saved` is not a
// dictionary or its `key` is absent or of another type.
c10::IValue state_field(const c10::IValue& saved, const std::string& key,
                        const std::string& source);
// Absent keys (states written before the key existed): std::nullopt.
std::optional<c10::IValue> optional_state_field(const c10::IValue& saved, const std::string& key,
                                                const std::string& source);
int64_t state_int(const c10::IValue& saved, const std::string& key, const std::string& source);
// An integer or a floating-point number, as a double.
double state_number(const c10::IValue& saved, const std::string& key, const std::string& source);
// "SOURCE: holds a <type of value>, expected EXPECTED", for a value of the wrong type.
std::string state_type_error(const std::string& source, const std::string& expected,
                             const c10::IValue& value);

}  // namespace fabric

#endif  // FABRIC_CORE_STATEFUL_H_
