"""PyTorch's own DDP (Python, Gloo) on the model, batch, threads and steps of ddp_step.cc.

  python3 tools/bench/ddp_step.py --world=2 --steps=60 --warmup=10 --batch=64 --threads=1
      [--model=mlp|resnet18|gpt-tiny] [--precision=32-true|bf16-mixed]
      [--optimizer=loop|foreach|fused]
      [--zero]
mlp: ddp_step.cc's MLP, MSE loss, SGD lr 0.01 momentum 0.9. resnet18: the main job's ResNet-18
CIFAR (models.py = examples/common/models.cc, plain BatchNorm), 3x32x32 inputs, cross-entropy,
SGD lr 0.1 momentum 0.9 Nesterov weight decay 5e-4. gpt-tiny: fabric::models::GPT's tiny preset
as gpt_reference.py writes it (4 layers, width 128, 256 positions, vocabulary 256), --batch
sequences of 256 random token ids, next-token cross-entropy, SGD lr 0.01 momentum 0.9. --optimizer
picks torch.optim.SGD's
implementation (loop: foreach=False, the CPU default; fused: fused=True), to match ddp_step.cc's
--optimizer_impl (for_loop / foreach / fused). --zero wraps the SGD in
torch.distributed.optim.ZeroRedundancyOptimizer (ZeRO-1 over DDP: gradients all-reduced, each
rank steps its parameters, then broadcasts them), against ddp_step.cc --shard_optimizer_state.
--fsdp=full_shard|shard_grad_op: PyTorch FSDP2 (torch.distributed.fsdp.fully_shard, DTensor) on
Gloo CPU instead of DDP: each Linear (mlp) or each Conv2d and the Linear (resnet18) a unit, then
the root; reshard_after_forward True for full_shard, False for shard_grad_op; against ddp_step.cc
--fsdp with the same units.
Rank 0 prints "ddp_step_ms median=X mean=Y" and "peak_rss_mib=Z" (its own peak resident set). Used by ddp_compare.py; not part of any product path.
"""
import argparse
import os
import resource
import socket
import statistics
import time

import contextlib
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpt_reference  # noqa: E402
import models  # noqa: E402


def make_model(args):
    """ddp_step.cc's models: the MLP 1024 → 2048 → 1024 → 512 (4.72M parameters) or ResNet-18."""
    if args.model == "resnet18":
        return models.make("resnet18")
    if args.model == "gpt-tiny":
        return gpt_reference.GPT(dict(gpt_reference.PRESETS["gpt-tiny"]))
    return torch.nn.Sequential(torch.nn.Linear(1024, 2048), torch.nn.ReLU(),
                               torch.nn.Linear(2048, 1024), torch.nn.ReLU(),
                               torch.nn.Linear(1024, 512))


def make_optimizer(params, args):
    """SGD as ddp_step.cc builds it, with the implementation --optimizer names (--zero: sharded
    by ZeroRedundancyOptimizer)."""
    impl = {"loop": dict(foreach=False), "foreach": dict(foreach=True), "fused": dict(fused=True)}
    if args.model == "resnet18":
        options = dict(lr=0.1, momentum=0.9, nesterov=True, weight_decay=5e-4)
    else:
        options = dict(lr=0.01, momentum=0.9)
    options.update(impl[args.optimizer])
    if args.zero:
        from torch.distributed.optim import ZeroRedundancyOptimizer
        return ZeroRedundancyOptimizer(params, optimizer_class=torch.optim.SGD, **options)
    return torch.optim.SGD(params, **options)


def parse_args():
    p = argparse.ArgumentParser()
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--bucket_cap_mb", type=float, default=25.0)
    p.add_argument("--model", default="mlp", choices=["mlp", "resnet18", "gpt-tiny"])
    p.add_argument("--precision", default="32-true", choices=["32-true", "bf16-mixed"])
    p.add_argument("--optimizer", default="loop", choices=["loop", "foreach", "fused"])
    p.add_argument("--zero", action="store_true")
    p.add_argument("--fsdp", default="", choices=["", "full_shard", "shard_grad_op"])
    p.add_argument("--profile", action="store_true",
                   help="record the timed steps with torch.profiler; rank 0 prints its ops by "
                   "self CPU time (ddp_step --profile prints ours)")
    p.add_argument("--profile_rows", type=int, default=30)
    args = p.parse_args()
    if args.profile and args.warmup < 1:
        p.error("--profile needs --warmup of at least 1 (as ddp_step --profile)")
    return args


def time_steps(args, model, opt, backward):
    """Per-step wall times (ms) of the timed steps: zero_grad, forward + loss, backward, step."""
    if args.model == "resnet18":
        x = torch.randn(args.batch, 3, 32, 32)
        y = torch.randint(0, 10, (args.batch,))
        loss_fn = torch.nn.functional.cross_entropy
    elif args.model == "gpt-tiny":
        w = torch.randint(0, 256, (args.batch, 257))
        x, y = w[:, :256], w[:, 1:]

        def loss_fn(logits, targets):
            return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)),
                                                     targets.reshape(-1))
    else:
        x = torch.randn(args.batch, 1024)
        y = torch.randn(args.batch, 512)
        loss_fn = torch.nn.functional.mse_loss
    model.train()
    times = []
    prof = None
    if args.profile:
        prof = torch.profiler.profile(
            activities=[torch.profiler.ProfilerActivity.CPU],
            schedule=torch.profiler.schedule(wait=max(0, args.warmup - 1),
                                             warmup=1 if args.warmup > 0 else 0,
                                             active=args.steps))
        prof.start()
    for s in range(args.warmup + args.steps):
        t0 = time.perf_counter()
        opt.zero_grad()
        with (torch.autocast("cpu", dtype=torch.bfloat16) if args.precision == "bf16-mixed"
              else contextlib.nullcontext()):
            loss = loss_fn(model(x), y)
        backward(loss)
        opt.step()
        t1 = time.perf_counter()
        if s >= args.warmup:
            times.append((t1 - t0) * 1000)
        if prof is not None:
            prof.step()
    if prof is not None:
        prof.stop()
        if not torch.distributed.is_initialized() or torch.distributed.get_rank() == 0:
            print(prof.key_averages().table(sort_by="self_cpu_time_total",
                                            row_limit=args.profile_rows), flush=True)
    return times


def report(times):
    """The two lines ddp_compare.py reads (rank 0 only)."""
    print(f"ddp_step_ms median={statistics.median(times):.3f} mean={statistics.mean(times):.3f}",
          flush=True)
    print(f"peak_rss_mib={resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.1f}",
          flush=True)


def run(rank, args, port):
    torch.set_num_threads(args.threads)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=args.world)
    if args.fsdp:
        from torch.distributed.fsdp import fully_shard
        model = make_model(args)
        reshard = args.fsdp == "full_shard"
        for m in model.modules():
            if isinstance(m, (torch.nn.Linear, torch.nn.Conv2d)):
                fully_shard(m, reshard_after_forward=reshard)
        fully_shard(model, reshard_after_forward=reshard)
    else:
        model = DistributedDataParallel(make_model(args), bucket_cap_mb=args.bucket_cap_mb)
    opt = make_optimizer(model.parameters(), args)
    times = time_steps(args, model, opt, lambda loss: loss.backward())
    if rank == 0:
        report(times)
    dist.barrier()
    dist.destroy_process_group()


def spawn(fn, args):
    """Runs fn(rank, args, port) in args.world processes, port being a free one on loopback."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(fn, args=(args, port), nprocs=args.world)


def main():
    spawn(run, parse_args())


if __name__ == "__main__":
    main()
