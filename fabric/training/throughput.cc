#include "fabric/training/throughput.h"

#include <algorithm>
#include <string>

#include "fabric/core/error.h"

namespace fabric {

Throughput::Throughput(int world_size, std::optional<double> peak_tflops)
    : world_size_(std::max(world_size, 1)), peak_(peak_tflops) {
  if (peak_ && !(*peak_ > 0)) peak_.reset();
}

void Throughput::set_flops_per_unit(double flops, const std::string& source) {
  if (!(flops >= 0))
    throw Error("Throughput: FLOPs per unit must be >= 0 (got " + std::to_string(flops) + ")");
  flops_per_unit_ = flops;
  source_ = flops > 0 ? source : "none";
}

Throughput::Rates Throughput::rates(double units, double seconds) const {
  Rates r;
  r.per_rank = units / std::max(seconds, 1e-9);
  r.job = r.per_rank * world_size_;
  if (flops_per_unit_ > 0) {
    r.tflops_per_rank = r.per_rank * flops_per_unit_ / 1e12;
    r.tflops = r.tflops_per_rank * world_size_;
    if (peak_) r.mfu = r.tflops / (*peak_ * world_size_);
  }
  return r;
}

std::map<std::string, double> Throughput::metrics(const Rates& r, const std::string& unit) {
  std::map<std::string, double> m{{"train/" + unit + "_per_second", r.job},
                                  {"train/" + unit + "_per_second_per_rank", r.per_rank}};
  if (r.tflops >= 0) {
    m["train/tflops"] = r.tflops;
    m["train/tflops_per_rank"] = r.tflops_per_rank;
  }
  if (r.mfu >= 0) m["train/mfu"] = r.mfu;
  return m;
}

}  // namespace fabric
