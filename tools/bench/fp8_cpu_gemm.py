"""One GEMM on CPU: float8 three ways against a bf16 matmul.

What fabric.precision: fp8-mixed costs on CPU per Linear GEMM (the warning the Connector prints
quotes these figures), through the torch wheel: torch._scaled_mm (tensorwise scales, bf16
output; on a CPU with AMX-int8 LibTorch hands it to oneDNN), and the arithmetic Fabric++ runs on
every CPU instead since 2026-12-01 (fabric/nn/fp8_gemm.cc: both operands to float32 times their
scales, one float32 matmul, then bf16; LibTorch's own emulation on CPUs without AMX):

    python3 tools/bench/fp8_cpu_gemm.py [--sizes 64,128,256] [--reps 5] [--threads N]

Prints, per size M=N=K, the median seconds of each and their ratio. Interleaved repetitions.
"""
import argparse
import statistics
import time

import torch


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--sizes", default="64,128,256")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--threads", type=int, default=0, help="0: torch's default")
    a = p.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    for n in (int(s) for s in a.sizes.split(",")):
        x = torch.randn(n, n)
        w = torch.randn(n, n)
        xb, wb = x.bfloat16(), w.bfloat16()
        sx = (x.abs().max() / 448.0).float()
        sw = (w.abs().max() / 448.0).float()
        x8 = (x / sx).to(torch.float8_e4m3fn)
        w8 = (w / sw).to(torch.float8_e4m3fn).t().contiguous().t()  # column-major second operand
        def ours():
            a8 = x8.contiguous().float() * sx.item()
            b8 = w8.contiguous().float() * sw.item()
            return torch.matmul(a8, b8).to(torch.bfloat16)

        sides = {
            "_scaled_mm": lambda: torch._scaled_mm(x8, w8, scale_a=sx, scale_b=sw,
                                                   out_dtype=torch.bfloat16),
            "ours": ours,
            "bf16": lambda: torch.matmul(xb, wb),
        }
        times = {k: [] for k in sides}
        for f in sides.values():
            f()
        for _ in range(a.reps):
            for k, f in sides.items():
                t = time.perf_counter()
                f()
                times[k].append(time.perf_counter() - t)
        m = {k: statistics.median(v) for k, v in times.items()}
        print(f"{n}x{n}x{n}: fp8 _scaled_mm {m['_scaled_mm'] * 1e3:.3f} ms, ours {m['ours'] * 1e3:.3f} ms, "
              f"bf16 matmul {m['bf16'] * 1e3:.3f} ms; /bf16: _scaled_mm {m['_scaled_mm'] / m['bf16']:.0f}x, "
              f"ours {m['ours'] / m['bf16']:.1f}x")


if __name__ == "__main__":
    main()
