#!/usr/bin/env python3
"""Compares two weight files that Fabric++ exported (torch.load(weights_only=True): name -> tensor).

    compare_weights.py [--bitwise] [--tol=X] A B

Prints one line: "bitwise (N tensors)" when every tensor is bitwise equal, else
"max_rel=X at NAME (N tensors; bound Y)" where X is the largest of max|a - b| / max|b| over the
tensors. Exit status: 0 bitwise, or (without --bitwise) X <= the bound (--tol, default 1e-4: far
below what a wrong average, a missing shard or a skipped step does to a few steps of training);
1 otherwise or when the files hold other names, shapes or dtypes; 2 usage error or unreadable file.
Used by tools/gpu_check.sh.
"""
import argparse
import sys

import torch


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--bitwise", action="store_true", help="only bitwise equality passes")
    p.add_argument("--tol", type=float, default=1e-4, help="bound on the max relative difference")
    p.add_argument("a")
    p.add_argument("b")
    args = p.parse_args()
    try:
        a = torch.load(args.a, map_location="cpu", weights_only=True)
        b = torch.load(args.b, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - any reason the file cannot be read is one line
        print(f"cannot read the weights: {str(e).splitlines()[0]}")
        return 2
    if sorted(a) != sorted(b):
        print(f"different names: {sorted(set(a) ^ set(b))[:5]}")
        return 1
    worst, where, bitwise = 0.0, "", True
    for name in sorted(a):
        x, y = a[name], b[name]
        if x.dtype != y.dtype or x.shape != y.shape:
            print(f"{name}: {x.dtype}{list(x.shape)} vs {y.dtype}{list(y.shape)}")
            return 1
        if torch.equal(x, y):
            continue
        bitwise = False
        if not x.is_floating_point():
            print(f"{name}: integer values differ")
            return 1
        x, y = x.double(), y.double()
        rel = ((x - y).abs().max() / y.abs().max().clamp_min(1e-12)).item()
        if rel != rel or rel > worst:  # NaN counts as the worst
            worst, where = rel, name
    if bitwise:
        print(f"bitwise ({len(a)} tensors)")
        return 0
    bound = 0.0 if args.bitwise else args.tol
    print(f"max_rel={worst:.3g} at {where} ({len(a)} tensors; bound {bound:g})")
    return 0 if worst <= bound else 1


if __name__ == "__main__":
    sys.exit(main())
