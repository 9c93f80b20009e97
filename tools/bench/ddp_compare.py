"""Interleaved A/B of 2-rank CPU DDP step time: Fabric++ (ddp_step) vs PyTorch DDP (ddp_step.py).

  bazel build -c opt //tools/bench:ddp_step
  python3 tools/bench/ddp_compare.py --reps=7 [--lightning] [--accelerate] [--gloo] [--cpp_flags=...]
                                     [--py_flags=...] [-- extra flags for all]
  Like for like: the same optimizer implementation on both sides, e.g.
    --cpp_flags=--optimizer_impl=fused --py_flags=--optimizer=fused       (fused SGD both)
    --cpp_flags=--optimizer_impl=for_loop --py_flags=--optimizer=loop     (per-parameter loop both)
  The main job's model: -- --model=resnet18 --precision=bf16-mixed --batch=64 --steps=10 --warmup=3
Runs the two programs alternately (order flipped every repetition), reads each run's median step
time, and prints the per-repetition ratios and their median (Fabric++ / PyTorch; < 1 is faster).
With --lightning, Lightning Fabric (pip `lightning`) joins as a column, with --accelerate Hugging
Face Accelerate (pip `accelerate`); with --gloo, Fabric++ with
fabric.ddp.cpu_backend=gloo (the all-reduce PyTorch uses) does.
"""
import argparse
import os
import re
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def measure(cmd):
    """(median step ms, rank 0's peak RSS MiB) of one run."""
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    m = re.search(r"ddp_step_ms median=([0-9.]+)", out)
    r = re.search(r"peak_rss_mib=([0-9.]+)", out)
    if not m or not r:
        raise SystemExit(f"no timing or peak_rss_mib in the output of {' '.join(cmd)}:\n{out}")
    return float(m.group(1)), float(r.group(1))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--lightning", action="store_true")
    p.add_argument("--accelerate", action="store_true")
    p.add_argument("--gloo", action="store_true", help="add Fabric++ on Gloo as a column")
    p.add_argument("--cpp_flags", default="", help="extra flags for ddp_step only, e.g. "
                   "--optimizer_impl=for_loop")
    p.add_argument("--py_flags", default="", help="extra flags for the Python programs only, e.g. "
                   "--optimizer=fused")
    p.add_argument("extra", nargs="*")
    args = p.parse_args()
    cpp = ([os.path.join(ROOT, "bazel-bin/tools/bench/ddp_step")] + args.extra +
           args.cpp_flags.split())
    py_extra = args.extra + args.py_flags.split()
    py = [sys.executable, os.path.join(HERE, "ddp_step.py")] + py_extra
    columns = {"fabric++": cpp, "pytorch_ddp": py}
    if args.accelerate:
        columns["accelerate"] = [sys.executable, os.path.join(HERE, "ddp_step_accelerate.py")] + py_extra
    if args.gloo:
        columns["fabric++_gloo"] = cpp + ["--cpu_backend=gloo"]
    if args.lightning:
        columns["lightning_fabric"] = [sys.executable, os.path.join(HERE, "ddp_step_lightning.py")] + py_extra
    times = {k: [] for k in columns}
    rss = {k: [] for k in columns}
    for rep in range(args.reps):
        order = list(columns) if rep % 2 == 0 else list(reversed(list(columns)))
        for name in order:
            ms, mib = measure(columns[name])
            times[name].append(ms)
            rss[name].append(mib)
        print(" ".join(f"{k}={times[k][-1]:.2f}ms" for k in columns), flush=True)
    ratios = [a / b for a, b in zip(times["fabric++"], times["pytorch_ddp"])]
    for k in columns:
        print(f"{k}: median step {statistics.median(times[k]):.3f} ms, "
              f"rank 0 peak RSS {max(rss[k]):.0f} MiB")
    print(f"ratio fabric++/pytorch_ddp: median {statistics.median(ratios):.3f} "
          f"(per repetition: {', '.join(f'{r:.3f}' for r in ratios)})")
    if args.lightning:
        lr = [a / b for a, b in zip(times["fabric++"], times["lightning_fabric"])]
        print(f"ratio fabric++/lightning_fabric: median {statistics.median(lr):.3f}")
    if args.accelerate:
        ar = [a / b for a, b in zip(times["fabric++"], times["accelerate"])]
        print(f"ratio fabric++/accelerate: median {statistics.median(ar):.3f}")
    if args.gloo:
        gr = [a / b for a, b in zip(times["fabric++_gloo"], times["pytorch_ddp"])]
        print(f"ratio fabric++_gloo/pytorch_ddp: median {statistics.median(gr):.3f}")


if __name__ == "__main__":
    main()
