// The examples' throughput monitor, from the throughput.* keys (configs/README.md):
// fabric::Throughput with one device's dense peak from throughput.peak_tflops, else
// fabric::peak_dense_tflops by the device's name and fabric.precision (unknown on CPUs: MFU is then
// left out), and the FLOPs per unit from throughput.flops_per_unit when it is set ("config").
#ifndef EXAMPLES_COMMON_THROUGHPUT_H_
#define EXAMPLES_COMMON_THROUGHPUT_H_

#include <algorithm>
#include <optional>

#include "fabric/accelerators/device_info.h"
#include "fabric/fabric.h"
#include "fabric/training/flop_counter.h"
#include "fabric/training/throughput.h"

namespace examples {

inline fabric::Throughput make_throughput(fabric::Fabric& f) {
  const fabric::Config& c = f.config();
  std::optional<double> peak;
  if (c.get_double("throughput.peak_tflops") > 0) {
    peak = c.get_double("throughput.peak_tflops");
  } else if (f.device().is_cuda()) {
    const auto info = fabric::query_runtime_info();
    const auto index = static_cast<size_t>(std::max<int>(f.device().index(), 0));
    if (index < info.devices.size())
      peak = fabric::peak_dense_tflops(info.devices[index].name, c.get_string("fabric.precision"));
  }
  fabric::Throughput tp(f.world_size(), peak);
  if (c.get_double("throughput.flops_per_unit") > 0)
    tp.set_flops_per_unit(c.get_double("throughput.flops_per_unit"), "config");
  return tp;
}

}  // namespace examples

#endif  // EXAMPLES_COMMON_THROUGHPUT_H_
