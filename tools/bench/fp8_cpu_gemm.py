"""One GEMM on CPU: float8 (torch._scaled_mm, tensorwise scales, bf16 output) vs bf16 matmul.

What fabric.precision: fp8-mixed costs on CPU per Linear GEMM (the warning the Connector prints
quotes these figures). Runs the same LibTorch ops Fabric++ calls, through the torch wheel:

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
        fp8, bf16 = [], []
        torch.matmul(xb, wb)
        torch._scaled_mm(x8, w8, scale_a=sx, scale_b=sw, out_dtype=torch.bfloat16)
        for _ in range(a.reps):
            t = time.perf_counter()
            torch._scaled_mm(x8, w8, scale_a=sx, scale_b=sw, out_dtype=torch.bfloat16)
            fp8.append(time.perf_counter() - t)
            t = time.perf_counter()
            torch.matmul(xb, wb)
            bf16.append(time.perf_counter() - t)
        f, b = statistics.median(fp8), statistics.median(bf16)
        print(f"{n}x{n}x{n}: fp8 _scaled_mm {f * 1e3:.2f} ms, bf16 matmul {b * 1e3:.3f} ms, "
              f"fp8/bf16 {f / b:.0f}x")


if __name__ == "__main__":
    main()
