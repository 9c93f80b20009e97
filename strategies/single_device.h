// fabric::strategies::SingleDevice: one process, one device (CPU or one GPU).
#ifndef STRATEGIES_SINGLE_DEVICE_H_
#define STRATEGIES_SINGLE_DEVICE_H_

#include "strategies/strategy.h"

namespace fabric::strategies {

class SingleDevice : public Strategy {
 public:
  SingleDevice(torch::Device device, std::unique_ptr<Precision> precision);

  std::string name() const override { return "single_device"; }
  torch::Device root_device() const override { return device_; }
  void setup_environment() override;
  void setup_module(torch::nn::Module& module) override;
  torch::Tensor all_reduce(const torch::Tensor& tensor, ReduceOp op) override;
  torch::Tensor broadcast(const torch::Tensor& tensor, int64_t src) override;

 private:
  torch::Device device_;
};

}  // namespace fabric::strategies

#endif  // STRATEGIES_SINGLE_DEVICE_H_
