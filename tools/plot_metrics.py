"""Draws the metrics.csv curves of runs to one PNG: bazel run //tools:plot -- PATH... [flags].

PATH is a run directory (holding metrics.csv), a metrics.csv file, or a sweep directory (every
runs/*/metrics.csv in it, one curve per run, labelled with the run id). One panel per metric column
(train/loss, test/accuracy, lr, train/images_per_second, ... anything logged with Fabric::log),
against the step.

Flags:
  --out=FILE.png   default: <PATH>/metrics.png for one run, <PATH>/curves.png for a sweep
  --size=WxH       image size in pixels (default 1200x800)
  --metrics=a,b    only these columns
Exit status: 0 written (its path is printed); 2 usage error or nothing to plot.
"""
import csv
import math
import os
import sys

SKIP = {"step", "epoch"}


def fail(message):
    print("plot: " + message, file=sys.stderr)
    sys.exit(2)


def read_csv(path):
    """{column: [(step, value), ...]} of the numeric cells of one metrics.csv."""
    series = {}
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        if not reader.fieldnames or "step" not in reader.fieldnames:
            fail(path + ": not a metrics.csv (no 'step' column)")
        for row in reader:
            try:
                step = int(row["step"])
            except (TypeError, ValueError):
                continue
            for name, cell in row.items():
                if name in SKIP or cell in (None, ""):
                    continue
                try:
                    value = float(cell)
                except ValueError:
                    continue
                if math.isfinite(value):
                    series.setdefault(name, []).append((step, value))
    return series


def collect(paths):
    """[(label, metrics.csv path)] and whether the inputs are sweeps."""
    curves, sweep = [], False
    for p in paths:
        if os.path.isfile(p):
            curves.append((os.path.basename(os.path.dirname(os.path.abspath(p))), p))
        elif os.path.isfile(os.path.join(p, "metrics.csv")):
            curves.append((os.path.basename(os.path.abspath(p)), os.path.join(p, "metrics.csv")))
        elif os.path.isdir(os.path.join(p, "runs")):
            sweep = True
            found = False
            for run in sorted(os.listdir(os.path.join(p, "runs"))):
                f = os.path.join(p, "runs", run, "metrics.csv")
                if os.path.isfile(f):
                    curves.append((run, f))
                    found = True
            if not found:
                fail(p + ": no runs/*/metrics.csv in this sweep directory yet")
        else:
            fail(p + ": no metrics.csv (give a run directory, a metrics.csv or a sweep directory)")
    return curves, sweep


def main(argv):
    out, size, only, paths = None, (1200, 800), None, []
    for arg in argv:
        if arg in ("-h", "--help"):
            print(__doc__)
            return 0
        if arg.startswith("--out="):
            out = arg[len("--out="):]
        elif arg.startswith("--size="):
            try:
                w, h = (int(v) for v in arg[len("--size="):].lower().split("x"))
                if w < 100 or h < 100:
                    raise ValueError
            except ValueError:
                fail(arg + ": expected WIDTHxHEIGHT in pixels, each at least 100, e.g. --size=1200x800")
            size = (w, h)
        elif arg.startswith("--metrics="):
            only = [m for m in arg[len("--metrics="):].split(",") if m]
        elif arg.startswith("-"):
            fail("unknown flag '" + arg + "' (flags: --out=, --size=, --metrics=; see --help)")
        else:
            paths.append(arg)
    if not paths:
        fail("give a run directory, a metrics.csv or a sweep directory (see --help)")
    curves, sweep = collect(paths)
    data = [(label, read_csv(f)) for label, f in curves]
    names = []
    for _, series in data:
        for name in series:
            if name not in names:
                names.append(name)
    first = ["train/loss", "test/accuracy", "lr", "train/images_per_second"]
    names.sort(key=lambda n: first.index(n) if n in first else len(first))
    if only is not None:
        unknown = [m for m in only if m not in names]
        if unknown:
            fail("no column " + ", ".join(unknown) + " in the data (columns: " + ", ".join(names) + ")")
        names = only
    if not names:
        fail("nothing to plot: the metrics.csv files have no values yet")
    if out is None:
        out = os.path.join(paths[0], "curves.png" if sweep else "metrics.png")

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    dpi = 100
    cols = 1 if len(names) == 1 else 2
    rows = (len(names) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(size[0] / dpi, size[1] / dpi), dpi=dpi,
                             squeeze=False)
    for i, name in enumerate(names):
        ax = axes[i // cols][i % cols]
        for label, series in data:
            points = series.get(name)
            if points:
                steps, values = zip(*points)
                ax.plot(steps, values, marker="o" if len(points) < 3 else None, markersize=3,
                        linewidth=1.2, label=label)
        ax.set_title(name, fontsize=10)
        ax.set_xlabel("step", fontsize=8)
        ax.tick_params(labelsize=8)
        ax.grid(alpha=0.3)
    for j in range(len(names), rows * cols):
        axes[j // cols][j % cols].axis("off")
    if len(data) > 1:
        axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=dpi)
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
