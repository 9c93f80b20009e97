// Checkpoints under pipeline parallelism (fabric.model_parallel.pipeline_parallel_size > 1): each
// stage holds some of the model's tensors (under the whole model's names) and an optimizer of its
// own parameters, numbered from 0. The checkpoint is the one a single process holding the whole
// model would write: every tensor once (a tied embedding the first stage's), and each optimizer
// in one process's layout (optimizer_state.h) numbered over the stages joined, stage by stage
// inside each parameter group, with the name of every index beside it:
//   {"type", "state": {I: {...}}, "param_groups": [{..., "params": [I, ...]}],
//    "param_names": [NAME of index 0, NAME of index 1, ...]}
// For blocks cut in order (one stage per rank) the joined numbering is the whole model's, so the
// file loads under any strategy as any other; a loader that reads "param_names" maps each
// index onto its own optimizer's by name (pipeline_localize), at any pipeline size.
//
// Saving: every stage's "state" as a skeleton (pipeline_skeleton: shapes and dtypes, no data) is
// exchanged over the pipeline; PipelineJoin numbers the optimizers from them; a sharded checkpoint
// then writes each stage's own tensors into its ranks' shards (own_pieces) and the pipeline's first
// rank joins the skeletons into common.pt (merge_first); a one-file checkpoint joins the stages'
// whole states on that rank.
#ifndef FABRIC_CHECKPOINT_PIPELINE_STATE_H_
#define FABRIC_CHECKPOINT_PIPELINE_STATE_H_

#include <ATen/core/ivalue.h>

#include <cstddef>
#include <map>
#include <set>
#include <string>
#include <vector>

namespace fabric {

inline constexpr char kParamNamesKey[] = "param_names";

// `optimizer` (one process's layout) with "param_names": `names` by index (groups in order).
c10::IValue with_parameter_names(const c10::IValue& optimizer,
                                 const std::vector<std::vector<std::string>>& names);

// `value` with every tensor and tensor piece replaced by an empty piece of its shape, dtype and
// layout (a whole tensor's with contiguous strides): what a descriptor needs, no data.
c10::IValue pipeline_skeleton(const c10::IValue& value);

// `a` with what `b` adds: keys `a` lacks taken from `b`, dicts merged key by key, lists of dicts
// of the same length item by item; where both hold a value, `a`'s.
c10::IValue merge_first(const c10::IValue& a, const c10::IValue& b);

class PipelineJoin {
 public:
  // `skeletons`: every stage's "state" dict (pipeline_skeleton of it), in stage order;
  // `optimizers`: the names of its optimizer entries (each with "param_names"). fabric::Error
  // when the stages' optimizers have different numbers of parameter groups.
  PipelineJoin(std::vector<c10::IValue> skeletons, const std::vector<std::string>& optimizers);

  // Stage `stage`'s "state" with each optimizer in the joined numbering: the state of parameters
  // an earlier stage also holds left out, every group's "params" and "param_names" the joined.
  c10::IValue renumber(const c10::IValue& state, size_t stage) const;
  // Stage `stage`'s renumbered "state" as its rank writes it into a sharded checkpoint: tensors an
  // earlier stage also holds as empty pieces (that stage writes them), whole tensors held first
  // here as whole pieces where `writes` (the first of the ranks holding this stage), else empty.
  c10::IValue own_pieces(const c10::IValue& state, size_t stage, bool writes) const;
  // Every stage's renumbered skeleton merged into `root` (the first stage's renumbered state).
  c10::IValue join_skeletons(const c10::IValue& root) const;

 private:
  struct Numbering {
    std::map<std::string, int64_t> index;  // joined index by name
    std::map<std::string, size_t> owner;   // the first stage holding the name
    std::vector<std::string> names;        // by joined index
    std::vector<std::vector<int64_t>> groups;
  };
  c10::IValue renumber_optimizer(const c10::IValue& optimizer, const Numbering& n,
                                 size_t stage) const;

  std::vector<c10::IValue> skeletons_;
  std::map<std::string, Numbering> numbering_;  // by optimizer entry
  std::vector<std::set<std::string>> earlier_;  // per stage: the leaf paths of the stages before
};

// Loading: a checkpoint's dict (format.h) fitted to this process. Each optimizer entry of
// `optimizers` whose value has "param_names" renumbered by name onto this process's optimizer
// (`names`: its parameters' names by group, one process's order), the parameters it does not hold
// left out; fabric::Error "SOURCE: ..." when one of its parameters is not in the checkpoint or
// the group counts differ. With `stage_only` (this process holds a pipeline stage): each module
// entry of `modules` keeps only the names it holds, and entries not in `entries` are left out.
struct PipelineLocal {
  std::map<std::string, std::vector<std::vector<std::string>>> optimizers;
  std::map<std::string, std::set<std::string>> modules;
  std::set<std::string> entries;
  bool stage_only = false;
};
c10::IValue pipeline_localize(const c10::IValue& contents, const PipelineLocal& local,
                              const std::string& source);

// The saved names of each optimizer entry of `local` that has "param_names", from a checkpoint's
// dict (a sharded one's common.pt).
std::map<std::string, std::vector<std::string>> saved_parameter_names(const c10::IValue& contents,
                                                                      const PipelineLocal& local);

}  // namespace fabric

#endif  // FABRIC_CHECKPOINT_PIPELINE_STATE_H_
