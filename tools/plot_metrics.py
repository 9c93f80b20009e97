"""Draws the metrics.csv curves of runs to one PNG: bazel run //tools:plot -- PATH... [flags].

PATH is a run directory (holding metrics.csv), a metrics.csv file, or a sweep directory (every
runs/*/metrics.csv in it, one curve per run). One panel per metric column (train/loss,
test/accuracy, lr, train/images_per_second, ... anything logged with Fabric::log), against the step.

A sweep directory with a sweep_state.json colours each curve by its run's status (done, pruned,
diverged, failed, interrupted, running; the legend counts them), and, when it has results.csv,
also draws metric_by_key.png beside it: the sweep's metric (the first metric column of
results.csv) against each swept key, one panel per key, a point per run with a value, coloured by
status (a logarithmic axis for positive values spanning more than a decade). A line per figure is
printed: "PATH: N curves (2 done, 6 pruned)" and "PATH: METRIC against KEY, KEY (N runs)".

Flags:
  --out=FILE.png   the curves; default: <PATH>/metrics.png for one run, <PATH>/curves.png for a sweep
  --size=WxH       image size in pixels (default 1200x800)
  --metrics=a,b    only these columns
Exit status: 0 written (its path is printed); 2 usage error or nothing to plot.
"""
import csv
import json
import math
import os
import sys

SKIP = {"step", "epoch"}
STATUS_COLOURS = {"done": "tab:blue", "pruned": "tab:orange", "diverged": "tab:red",
                  "failed": "tab:gray", "interrupted": "tab:purple", "running": "tab:green"}


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


def run_statuses(sweep_dir):
    """{run directory name: status} from sweep_state.json ({} without one). A retried run's
    directories (<id>-1, <id>-2) take their run's status."""
    path = os.path.join(sweep_dir, "sweep_state.json")
    if not os.path.isfile(path):
        return {}
    try:
        with open(path) as f:
            runs = json.load(f)["runs"]
    except (OSError, ValueError, KeyError) as e:
        fail(path + ": not a sweep state file (" + str(e) + ")")
    statuses = {}
    for name in os.listdir(os.path.join(sweep_dir, "runs")):
        run_id = name
        if run_id not in runs and "-" in name and name.rsplit("-", 1)[1].isdigit():
            run_id = name.rsplit("-", 1)[0]
        if run_id in runs:
            statuses[name] = runs[run_id].get("status", "running")
    return statuses


def counted(statuses):
    order = list(STATUS_COLOURS)
    counts = {}
    for s in statuses:
        counts[s] = counts.get(s, 0) + 1
    keys = sorted(counts, key=lambda s: order.index(s) if s in order else len(order))
    return ", ".join("%d %s" % (counts[k], k) for k in keys)


def metric_by_key(sweep_dir, size, plt):
    """metric_by_key.png from results.csv; returns the printed line, or None without results."""
    import matplotlib.ticker
    path = os.path.join(sweep_dir, "results.csv")
    if not os.path.isfile(path):
        return None
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        fields = reader.fieldnames or []
        rows = list(reader)
    if "attempts" not in fields or "seed" not in fields:
        fail(path + ": not a sweep results.csv (no attempts/seed columns)")
    keys = fields[fields.index("attempts") + 1:fields.index("seed")]
    metric = fields[fields.index("seed") + 1] if fields.index("seed") + 1 < len(fields) else None
    points = []
    for row in rows:
        try:
            value = float(row.get(metric) or "nan")
        except ValueError:
            continue
        if math.isfinite(value):
            points.append((row, value))
    if not keys or metric is None or not points:
        return None
    dpi = 100
    cols = min(len(keys), 2)
    rows_n = (len(keys) + cols - 1) // cols
    fig, axes = plt.subplots(rows_n, cols, figsize=(size[0] / dpi, size[1] / dpi), dpi=dpi,
                             squeeze=False)
    for i, key in enumerate(keys):
        ax = axes[i // cols][i % cols]
        texts = [row[key] for row, _ in points]
        try:
            xs = [float(t) for t in texts]
            positive = all(x > 0 for x in xs)
            if positive and max(xs) > 10 * min(xs):
                ax.set_xscale("log")
                ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        except ValueError:  # categorical values: one position per distinct value
            order = sorted(set(texts))
            xs = [order.index(t) for t in texts]
            ax.set_xticks(range(len(order)))
            ax.set_xticklabels(order, fontsize=8)
        for status in sorted({row["status"] for row, _ in points}):
            sel = [(x, v) for x, (row, v) in zip(xs, points) if row["status"] == status]
            ax.scatter([x for x, _ in sel], [v for _, v in sel], s=18, label=status,
                       color=STATUS_COLOURS.get(status, "black"))
        ax.set_title(metric + " against " + key, fontsize=10)
        ax.set_xlabel(key, fontsize=8)
        ax.tick_params(labelsize=8)
        ax.grid(alpha=0.3)
    for j in range(len(keys), rows_n * cols):
        axes[j // cols][j % cols].axis("off")
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    out = os.path.join(sweep_dir, "metric_by_key.png")
    fig.savefig(out, dpi=dpi)
    plt.close(fig)
    n = len(points)
    return "%s: %s against %s (%d run%s)" % (out, metric, ", ".join(keys), n, "" if n == 1 else "s")


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
    statuses = run_statuses(paths[0]) if sweep and len(paths) == 1 else {}
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
        shown = set()
        for label, series in data:
            points = series.get(name)
            if points:
                steps, values = zip(*points)
                style = {"label": label}
                if statuses:  # one colour per status, one legend entry per status
                    status = statuses.get(label, "running")
                    style = {"color": STATUS_COLOURS.get(status, "black"),
                             "label": status if status not in shown else None}
                    shown.add(status)
                ax.plot(steps, values, marker="o" if len(points) < 3 else None, markersize=3,
                        linewidth=1.2, **style)
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
    plt.close(fig)
    if statuses:
        print("%s: %d curves (%s)" % (out, len(data), counted(statuses.get(l, "running") for l, _ in data)))
    else:
        print(out)
    if sweep and len(paths) == 1:
        line = metric_by_key(paths[0], size, plt)
        if line:
            print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
