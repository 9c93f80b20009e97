"""Hugging Face Accelerate (pip `accelerate`) on the model, batch, threads and steps of ddp_step.cc.

  python3 tools/bench/ddp_step_accelerate.py --world=2 --steps=60 --warmup=10 --batch=64 --threads=1
The ranks are spawned as ddp_step.py spawns them, with the environment `accelerate launch` would
set (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT); Accelerator(cpu=True) then runs DDP over
Gloo. Model, timing loop and output lines are ddp_step.py's. Used by ddp_compare.py --accelerate;
not part of any product path.
"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ddp_step  # noqa: E402


def run(rank, args, port):
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(args.world),
                      LOCAL_WORLD_SIZE=str(args.world), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    from accelerate import Accelerator
    from accelerate.utils import DistributedDataParallelKwargs
    torch.set_num_threads(args.threads)
    accelerator = Accelerator(
        cpu=True, kwargs_handlers=[DistributedDataParallelKwargs(bucket_cap_mb=args.bucket_cap_mb)])
    if accelerator.num_processes != args.world:
        raise SystemExit(f"accelerate runs {accelerator.num_processes} processes, not {args.world}")
    torch.set_num_threads(args.threads)
    model = ddp_step.make_model(args)
    opt = ddp_step.make_optimizer(model.parameters(), args)
    model, opt = accelerator.prepare(model, opt)
    times = ddp_step.time_steps(args, model, opt, accelerator.backward)
    if accelerator.is_main_process:
        ddp_step.report(times)
    accelerator.wait_for_everyone()
    accelerator.end_training()


def main():
    ddp_step.spawn(run, ddp_step.parse_args())


if __name__ == "__main__":
    main()
