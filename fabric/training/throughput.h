// fabric::Throughput: samples/s (or tokens/s), TFLOP/s and MFU per rank and for the job, from the
// units a rank processed in a window of time, FLOPs per unit and the devices' dense peak
// (Lightning's ThroughputMonitor, TorchTitan's MFU line).
//
// FLOPs per unit come from one of three sources, and the monitor says which: "counted" (a
// FlopCounter around one training step, divided by its units), "formula" (a model's own count,
// e.g. GPTConfig::flops_per_token) or "config" (the user's number). MFU is the job's achieved
// FLOP/s over world_size × the peak of one device (fabric::peak_dense_tflops, or a key); unknown
// (-1) without a peak.
//
//   fabric::Throughput tp(f.world_size(), fabric::peak_dense_tflops(name, precision));
//   tp.set_flops_per_unit(flops / batch, "counted");
//   auto r = tp.rates(window_samples_on_this_rank, seconds);
//   f.log_dict(tp.metrics(r, "samples"), step);   // train/samples_per_second, .../mfu
#ifndef FABRIC_TRAINING_THROUGHPUT_H_
#define FABRIC_TRAINING_THROUGHPUT_H_

#include <map>
#include <optional>
#include <string>

namespace fabric {

class Throughput {
 public:
  // peak_tflops: one device's dense peak for the run's precision (nullopt: unknown).
  Throughput(int world_size, std::optional<double> peak_tflops);

  // FLOPs of one unit's training step (forward + backward); source: counted | formula | config.
  void set_flops_per_unit(double flops, const std::string& source);
  bool has_flops() const { return flops_per_unit_ > 0; }
  double flops_per_unit() const { return flops_per_unit_; }
  const std::string& flops_source() const { return source_; }
  std::optional<double> peak_tflops() const { return peak_; }

  struct Rates {
    double per_rank = 0;          // units/s on this rank
    double job = 0;               // units/s of the job (per_rank × world size: equal shares)
    double tflops_per_rank = -1;  // -1: FLOPs per unit unknown
    double tflops = -1;           // the job's
    double mfu = -1;              // fraction of world size × peak; -1: unknown
  };
  // units: processed by this rank in `seconds`.
  Rates rates(double units, double seconds) const;

  // {"train/<unit>_per_second", "train/<unit>_per_second_per_rank", and where known
  // "train/tflops", "train/tflops_per_rank", "train/mfu"}: for Fabric::log_dict.
  static std::map<std::string, double> metrics(const Rates& r, const std::string& unit);

 private:
  int world_size_;
  std::optional<double> peak_;
  double flops_per_unit_ = 0;
  std::string source_ = "none";
};

}  // namespace fabric

#endif  // FABRIC_TRAINING_THROUGHPUT_H_
