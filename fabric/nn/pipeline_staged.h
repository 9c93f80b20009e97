// fabric::nn::PipelineStaged: what a module that is a model's pipeline stages (fabric/models/
// pipeline_stages.h: GPTStages, LlamaStages, SequentialStages) also is, so that a strategy can
// tell such a module from a whole model without depending on the models. Under
// fabric.model_parallel.pipeline_parallel_size > 1, strategies::ModelParallel refuses any other:
// every pipeline rank would hold and train the whole model on the same data.
#ifndef FABRIC_NN_PIPELINE_STAGED_H_
#define FABRIC_NN_PIPELINE_STAGED_H_

namespace fabric::nn {

class PipelineStaged {
 public:
  virtual ~PipelineStaged() = default;
};

}  // namespace fabric::nn

#endif  // FABRIC_NN_PIPELINE_STAGED_H_
