"""Side-by-side training throughput: Fabric++ (tools/bench/throughput.cc) vs the Python anchors
(tools/bench/throughput.py: raw eager loop, torch.compile raw loop, Lightning Fabric, Accelerate).

  python3 tools/bench/gpu_compare.py --cpp=PATH/throughput [--suite=resnet18|resnet50_epoch]
                                     [--reps=3] [--json=results.json] [--device=cuda]
resnet18 suite: ResNet-18 CIFAR, batches 128 and 512 × precisions 32-true / bf16-mixed / 16-mixed.
resnet50_epoch suite: ResNet-50 (ImageNet stem), batch 256, one epoch of 50,000 images with
on-device augmentation, bf16-mixed and 32-true.
Every configuration runs each program `reps` times, interleaved (order rotated per repetition);
the table shows median images/s, ratios to Lightning Fabric and to the raw loop, and peak device
memory (max over repetitions). A program that fails is shown as failed with its last line.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def run(cmd, timeout):
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None, "timeout"
    for line in out.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):]), ""
    tail = (out.stderr.strip().splitlines() or out.stdout.strip().splitlines() or ["?"])[-1]
    return None, tail[:200]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--cpp", required=True, help="the throughput binary (bazel-bin/tools/bench/throughput)")
    p.add_argument("--suite", default="resnet18", choices=["resnet18", "resnet50_epoch"])
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--frameworks",
                   default="fabric++,fabric++graphs,raw,compile,lightning,accelerate",
                   help="fabric++graphs: ours with --cuda_graphs (whole-step CUDA graphs)")
    p.add_argument("--device", default="cuda")
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--warmup", type=int, default=15)
    p.add_argument("--images", type=int, default=50000)
    p.add_argument("--extra_cpp", default="", help="extra flags for the C++ side (e.g. --channels_last)")
    p.add_argument("--extra_py", default="", help="extra flags for the Python side")
    p.add_argument("--timeout", type=int, default=900)
    p.add_argument("--batches", default="", help="override the suite's batch sizes, e.g. 16,32")
    p.add_argument("--precisions", default="", help="override the suite's precisions")
    p.add_argument("--json", default="")
    args = p.parse_args()
    frameworks = args.frameworks.split(",")
    if args.suite == "resnet18":
        configs = [dict(model="resnet18", batch=b, precision=pr, data="static")
                   for b in (128, 512) for pr in ("32-true", "bf16-mixed", "16-mixed")]
    else:
        configs = [dict(model="resnet50", batch=256, precision=pr, data="epoch")
                   for pr in ("bf16-mixed", "32-true")]
    if args.batches:
        configs = [dict(c, batch=int(b)) for c in configs if c is configs[0] or True
                   for b in args.batches.split(",")]
        configs = [dict(t) for t in {tuple(sorted(c.items())) for c in configs}]
    if args.precisions:
        configs = [c for c in configs if c["precision"] in args.precisions.split(",")]
    configs.sort(key=lambda c: (c["model"], c["batch"], c["precision"]))
    rows = []
    for c in configs:
        common = [f"--model={c['model']}", f"--batch={c['batch']}", f"--precision={c['precision']}",
                  f"--data={c['data']}", f"--steps={args.steps}", f"--warmup={args.warmup}",
                  f"--images={args.images}"]
        cmds = {}
        for fw in frameworks:
            if fw in ("fabric++", "fabric++graphs"):
                cmds[fw] = ([args.cpp] + common + [f"--accelerator={args.device}"] +
                            args.extra_cpp.split() + (["--cuda_graphs"] if fw != "fabric++" else []))
            else:
                cmds[fw] = ([sys.executable, os.path.join(HERE, "throughput.py"),
                             f"--framework={fw}", f"--device={args.device}"] + common +
                            args.extra_py.split())
        results = {fw: [] for fw in frameworks}
        failures = {}
        for rep in range(args.reps):
            order = frameworks[rep % len(frameworks):] + frameworks[:rep % len(frameworks)]
            for fw in order:
                if fw in failures:
                    continue
                r, why = run(cmds[fw], args.timeout)
                if r is None:
                    failures[fw] = why
                else:
                    results[fw].append(r)
        row = dict(c)
        for fw in frameworks:
            if results[fw]:
                row[fw] = dict(
                    images_per_s=statistics.median(r["images_per_s"] for r in results[fw]),
                    seconds=statistics.median(r["seconds"] for r in results[fw]),
                    peak_device_mib=max(r["peak_device_mib"] for r in results[fw]),
                    peak_rss_mib=max(r["peak_rss_mib"] for r in results[fw]),
                    runs=[r["images_per_s"] for r in results[fw]])
            else:
                row[fw] = dict(failed=failures.get(fw, "no result"))
        rows.append(row)
        print(json.dumps(row), flush=True)

    def ips(row, fw):
        return row.get(fw, {}).get("images_per_s")

    head = "| model | batch | precision | " + " | ".join(f"{fw} img/s" for fw in frameworks)
    head += " | ours/lightning | ours/raw | ours/compile | graphs/lightning | peak MiB (ours / raw) |"
    print("\n" + head)
    print("|" + " --- |" * (head.count("|") - 1))
    for row in rows:
        cells = [row["model"], str(row["batch"]), row["precision"]]
        for fw in frameworks:
            v = ips(row, fw)
            cells.append(f"{v:.0f}" if v else "failed: " + row[fw].get("failed", "?"))
        ours = ips(row, "fabric++")
        for ref in ("lightning", "raw", "compile"):
            v = ips(row, ref)
            cells.append(f"{ours / v:.3f}" if ours and v else "-")
        graphs, lightning = ips(row, "fabric++graphs"), ips(row, "lightning")
        cells.append(f"{graphs / lightning:.3f}" if graphs and lightning else "-")
        mem = [row.get(fw, {}).get("peak_device_mib") for fw in ("fabric++", "raw")]
        cells.append(" / ".join(f"{m:.0f}" if m is not None else "-" for m in mem))
        print("| " + " | ".join(cells) + " |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
