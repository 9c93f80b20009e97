"""Lightning Fabric (pip `lightning`) on the model, batch, threads and steps of ddp_step.cc.

  python3 tools/bench/ddp_step_lightning.py --world=2 --steps=60 --warmup=10 --batch=64 --threads=1
Lightning launches the ranks itself (strategy "ddp": the script re-runs per rank). Rank 0 prints
"ddp_step_ms median=X mean=Y" and "peak_rss_mib=Z" (its own peak resident set). Used by
ddp_compare.py --lightning; not part of any product path.
"""
import argparse
import resource
import statistics
import time

import torch
from lightning.fabric import Fabric


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--bucket_cap_mb", type=float, default=25.0)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    from lightning.fabric.strategies import DDPStrategy
    fabric = Fabric(accelerator="cpu", devices=args.world,
                    strategy=DDPStrategy(process_group_backend="gloo",
                                         bucket_cap_mb=args.bucket_cap_mb),
                    precision="32-true")
    fabric.launch()
    torch.set_num_threads(args.threads)
    model = torch.nn.Sequential(torch.nn.Linear(1024, 2048), torch.nn.ReLU(),
                                torch.nn.Linear(2048, 1024), torch.nn.ReLU(),
                                torch.nn.Linear(1024, 512))
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    model, opt = fabric.setup(model, opt)
    x = torch.randn(args.batch, 1024)
    y = torch.randn(args.batch, 512)
    times = []
    for s in range(args.warmup + args.steps):
        t0 = time.perf_counter()
        opt.zero_grad()
        fabric.backward(torch.nn.functional.mse_loss(model(x), y))
        opt.step()
        t1 = time.perf_counter()
        if s >= args.warmup:
            times.append((t1 - t0) * 1000)
    if fabric.global_rank == 0:
        print(f"ddp_step_ms median={statistics.median(times):.3f} mean={statistics.mean(times):.3f}",
              flush=True)
        print(f"peak_rss_mib={resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.1f}",
              flush=True)
    fabric.barrier()


if __name__ == "__main__":
    main()
