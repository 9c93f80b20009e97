"""Where the time of a profiled training window goes, from a Chrome trace written by
tools/bench/throughput.cc --profile=PATH or tools/bench/throughput.py --profile=PATH.

  python3 tools/bench/trace_summary.py TRACE.json [TRACE2.json ...] [--top=12]

For each trace: the steps (the "train_step" annotations), host time per step (issuing the work),
device busy time per step (union of kernels, copies and memsets), device idle gaps, CUDA runtime
calls by total time (a host-blocking call such as cudaStreamSynchronize, cudaEventSynchronize,
cudaHostAlloc or cudaFree shows here), the kernels with most device time and the host operators
with most time. Plain text on stdout; standard library only (runs on the GPU node as is).
"""
import argparse
import collections
import json
import statistics

DEVICE_CATS = {"kernel", "gpu_memcpy", "gpu_memset"}


def union_length(intervals):
    total, end = 0.0, None
    for a, b in sorted(intervals):
        if end is None or a > end:
            total += b - a
            end = b
        elif b > end:
            total += b - end
            end = b
    return total


def gaps(intervals, start, stop, threshold):
    out, end = [], start
    for a, b in sorted(intervals):
        if a - end > threshold:
            out.append((end, a))
        end = max(end, b)
    if stop - end > threshold:
        out.append((end, stop))
    return out


def summarize(path, top):
    with open(path) as f:
        events = [e for e in json.load(f).get("traceEvents", []) if e.get("ph") == "X"]
    steps = sorted((e for e in events if e.get("name") == "train_step"
                    and e.get("cat") in ("user_annotation", "cpu_op")), key=lambda e: e["ts"])
    device = [(e["ts"], e["ts"] + e.get("dur", 0)) for e in events if e.get("cat") in DEVICE_CATS]
    print(f"== {path}")
    if not steps:
        print("no train_step annotations")
        return
    n = len(steps)
    start = steps[0]["ts"]
    stop = max([steps[-1]["ts"] + steps[-1]["dur"]] + [b for _, b in device])
    wall = stop - start
    busy = union_length([(max(a, start), b) for a, b in device if b > start])
    print(f"steps {n}; window {wall / 1000:.1f} ms = {wall / n / 1000:.2f} ms/step; "
          f"device busy {busy / n / 1000:.2f} ms/step ({100 * busy / wall:.0f} %); "
          f"host issue time per step median "
          f"{statistics.median(s['dur'] for s in steps) / 1000:.2f} ms")
    idle = gaps([(a, b) for a, b in device if b > start], start, stop, 50) if device else []
    if idle:
        lengths = sorted((b - a for a, b in idle), reverse=True)
        print(f"device idle gaps > 50 us: {len(idle)}, {sum(lengths) / 1000:.2f} ms in all, "
              f"largest {', '.join(f'{x / 1000:.2f}' for x in lengths[:5])} ms")
        # What the host was doing during the three largest gaps.
        runtime = [e for e in events if e.get("cat") in ("cuda_runtime", "cuda_driver")]
        ops = [e for e in events if e.get("cat") == "cpu_op"]
        for a, b in sorted(idle, key=lambda g: g[0] - g[1])[:3]:
            during = collections.Counter()
            for e in runtime + ops:
                lo, hi = max(a, e["ts"]), min(b, e["ts"] + e.get("dur", 0))
                if hi > lo:
                    during[e["name"]] += hi - lo
            busiest = ", ".join(f"{k} {v / 1000:.2f}" for k, v in during.most_common(4))
            print(f"  gap {(b - a) / 1000:.2f} ms at +{(a - start) / 1000:.1f} ms: host in {busiest}")
    by = collections.defaultdict(list)
    for e in events:
        if e.get("cat") in ("cuda_runtime", "cuda_driver"):
            by[e["name"]].append(e.get("dur", 0))
    print("CUDA runtime calls (per step: count, ms; max single call ms):")
    for name, d in sorted(by.items(), key=lambda kv: -sum(kv[1]))[:top]:
        print(f"  {name:40s} {len(d) / n:8.1f} {sum(d) / n / 1000:8.3f}  max {max(d) / 1000:.3f}")
    kernels = collections.defaultdict(float)
    counts = collections.Counter()
    for e in events:
        if e.get("cat") in DEVICE_CATS:
            key = e["name"][:90]
            kernels[key] += e.get("dur", 0)
            counts[key] += 1
    print(f"device work (per step: ms, count), {sum(counts.values()) / n:.0f} launches per step:")
    for name, d in sorted(kernels.items(), key=lambda kv: -kv[1])[:top]:
        print(f"  {d / n / 1000:8.3f} {counts[name] / n:6.1f}  {name}")
    host = collections.defaultdict(float)
    hcount = collections.Counter()
    for e in events:
        if e.get("cat") == "cpu_op":
            host[e["name"]] += e.get("dur", 0)
            hcount[e["name"]] += 1
    print("host operators, inclusive (per step: ms, count):")
    for name, d in sorted(host.items(), key=lambda kv: -kv[1])[:top]:
        print(f"  {d / n / 1000:8.3f} {hcount[name] / n:6.1f}  {name[:90]}")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("traces", nargs="+")
    p.add_argument("--top", type=int, default=12)
    args = p.parse_args()
    for path in args.traces:
        summarize(path, args.top)


if __name__ == "__main__":
    main()
