// fabric::Callback: code that runs at the events of a training loop, registered on the Fabric
// (Lightning Fabric's `callbacks=` and `fabric.call("on_...")`).
//
//   struct PrintLoss : fabric::Callback {
//     std::string name() const override { return "print_loss"; }
//     void on_validation_end(fabric::Fabric& f, int64_t step, const fabric::Metrics& m) override {
//       f.print("step ", step, ": ", m.at("val/loss"));
//     }
//   };
//   f.add_callback(std::make_shared<PrintLoss>());
//   ... f.call("on_validation_end", step, {{"val/loss", loss}});     // the loop fires its events
//   if (f.should_stop()) break;                                      // every rank, same step
//
// Fabric fires the events it owns itself: on_save_checkpoint / on_load_checkpoint after
// Fabric::save / Fabric::load, on_exception when the function given to launch() throws. The loop
// fires the rest with Fabric::call: on_fit_start, on_fit_end, on_train_batch_end (`loss` holds
// {"loss": value} when the loop passes one), on_validation_end, and any hook name of its own
// (on_event). A callback that is also a fabric::Stateful is checkpointed by the loop that adds it
// to its CheckpointState (the examples add each under "callbacks.<name>").
//
// Built-in callbacks from the config (early stopping): fabric/callbacks.h.
#ifndef FABRIC_CALLBACK_H_
#define FABRIC_CALLBACK_H_

#include <cstdint>
#include <exception>
#include <map>
#include <string>

namespace fabric {

class Fabric;
using Metrics = std::map<std::string, double>;

class Callback {
 public:
  virtual ~Callback() = default;
  // Names the callback in messages and checkpoints; unique among a Fabric's callbacks.
  virtual std::string name() const = 0;

  virtual void on_fit_start(Fabric&) {}
  virtual void on_fit_end(Fabric&) {}
  virtual void on_train_batch_end(Fabric&, int64_t /*step*/, const Metrics& /*values*/) {}
  virtual void on_validation_end(Fabric&, int64_t /*step*/, const Metrics& /*metrics*/) {}
  virtual void on_save_checkpoint(Fabric&, const std::string& /*path*/) {}
  virtual void on_load_checkpoint(Fabric&, const std::string& /*path*/) {}
  virtual void on_exception(Fabric&, const std::exception&) {}
  // Fabric::call with a hook name other than the ones above.
  virtual void on_event(Fabric&, const std::string& /*hook*/, int64_t /*step*/,
                        const Metrics& /*values*/) {}

  // Non-empty: this callback asks the loop to stop, saying why (Fabric::should_stop).
  virtual std::string stop_reason() const { return ""; }
};

}  // namespace fabric

#endif  // FABRIC_CALLBACK_H_
