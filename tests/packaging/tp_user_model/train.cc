// The program of //tests/packaging:tp_user_model_test: docs/tensor_parallel.md's model (model.h,
// cut out of the doc by the test) trained by an ordinary Fabric loop, as a user's train.cpp would.
// The task needs no data files: sequences that follow token' = (3 * token + 1) mod vocab_size
// from a different start in every row, the same batches on every rank (one tp group reads one
// batch), with no random numbers, so a run at tp 1 and one at tp 2 see the same data.
// Prints "step N loss X" on rank 0 after every step and writes the weights, whole, to out.weights.
// Usage: train [key=value ...], e.g. train fabric.strategy=model_parallel fabric.devices=2
#include <cstdio>

#include "model.h"

int main(int argc, char** argv) {
  fabric::ConfigSchema schema = fabric::training_schema();
  schema.add("model.dropout", fabric::KeySpec::real(0.0).min(0).max(1, false));
  schema.add("out.weights", fabric::KeySpec::string("weights.pt"));
  schema.set_default("trainer.max_steps", "8");
  schema.set_default("data.batch_size", "8");
  return fabric::run_main(argc, argv, schema, [](const fabric::Config& c) {
    fabric::Fabric fabric(c);
    return fabric.launch([&](fabric::Fabric& f) {
      ModelConfig config;
      config.dropout = c.get_double("model.dropout");
      Gpt model(config);
      torch::optim::SGD optimizer(model->parameters(),
                                  torch::optim::SGDOptions(0.05).momentum(0.9));
      f.setup(model, optimizer);
      const int64_t B = c.get_int("data.batch_size"), T = 16, V = config.vocab_size;
      model->train();
      for (int64_t step = 0; step < c.get_int("trainer.max_steps"); ++step) {
        std::vector<torch::Tensor> columns = {(torch::arange(B) * 7 + step * 5) % V};
        for (int64_t t = 0; t < T; ++t) columns.push_back((columns.back() * 3 + 1) % V);
        const torch::Tensor sequence = f.to_device(torch::stack(columns, 1));  // [B, T + 1]
        optimizer.zero_grad();
        const torch::Tensor logits = model(sequence.narrow(1, 0, T));
        const torch::Tensor loss =
            torch::cross_entropy_loss(logits.reshape({-1, V}), sequence.narrow(1, 1, T).flatten());
        f.backward(loss);
        f.step(optimizer);
        char line[64];
        std::snprintf(line, sizeof line, "step %lld loss %.9g", static_cast<long long>(step),
                      loss.item<double>());
        f.print(line);
      }
      f.save_weights(model, c.get_string("out.weights"));
    });
  });
}
