"""Lightning Fabric (pip `lightning`) on the model, batch, threads and steps of ddp_step.cc.

  python3 tools/bench/ddp_step_lightning.py --world=2 --steps=60 --warmup=10 --batch=64 --threads=1
Lightning launches the ranks itself (strategy "ddp": the script re-runs per rank). Model, timing
loop and output lines are ddp_step.py's; rank 0 prints "ddp_step_ms median=X mean=Y" and
"peak_rss_mib=Z". Used by ddp_compare.py --lightning; not part of any product path.
"""
import os
import sys

import torch
from lightning.fabric import Fabric
from lightning.fabric.strategies import DDPStrategy

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ddp_step  # noqa: E402


def main():
    args = ddp_step.parse_args()
    torch.set_num_threads(args.threads)
    fabric = Fabric(accelerator="cpu", devices=args.world,
                    strategy=DDPStrategy(process_group_backend="gloo",
                                         bucket_cap_mb=args.bucket_cap_mb),
                    precision="32-true")
    fabric.launch()
    torch.set_num_threads(args.threads)
    model = ddp_step.make_model(args)
    opt = ddp_step.make_optimizer(model.parameters(), args)
    model, opt = fabric.setup(model, opt)
    times = ddp_step.time_steps(args, model, opt, fabric.backward)
    if fabric.global_rank == 0:
        ddp_step.report(times)
    fabric.barrier()


if __name__ == "__main__":
    main()
