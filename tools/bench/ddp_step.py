"""PyTorch's own DDP (Python, Gloo) on the model, batch, threads and steps of ddp_step.cc.

  python3 tools/bench/ddp_step.py --world=2 --steps=60 --warmup=10 --batch=64 --threads=1
Rank 0 prints "ddp_step_ms median=X mean=Y" and "peak_rss_mib=Z" (its own peak resident set). Used by ddp_compare.py; not part of any product path.
"""
import argparse
import os
import resource
import socket
import statistics
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel


def make_model():
    """The benchmark MLP (ddp_step.cc's): 1024 → 2048 → 1024 → 512, 4.72M parameters."""
    return torch.nn.Sequential(torch.nn.Linear(1024, 2048), torch.nn.ReLU(),
                               torch.nn.Linear(2048, 1024), torch.nn.ReLU(),
                               torch.nn.Linear(1024, 512))


def parse_args():
    p = argparse.ArgumentParser()
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--bucket_cap_mb", type=float, default=25.0)
    return p.parse_args()


def time_steps(args, model, opt, backward):
    """Per-step wall times (ms) of the timed steps: zero_grad, MSE forward, backward, step."""
    x = torch.randn(args.batch, 1024)
    y = torch.randn(args.batch, 512)
    times = []
    for s in range(args.warmup + args.steps):
        t0 = time.perf_counter()
        opt.zero_grad()
        backward(torch.nn.functional.mse_loss(model(x), y))
        opt.step()
        t1 = time.perf_counter()
        if s >= args.warmup:
            times.append((t1 - t0) * 1000)
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
    model = DistributedDataParallel(make_model(), bucket_cap_mb=args.bucket_cap_mb)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
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
