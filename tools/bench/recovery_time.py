#!/usr/bin/env python3
"""Time to recover: from a rank's death to the first training step after the restart.

    bazel build //examples:fashion_mnist
    python3 tools/bench/recovery_time.py [--trials 3] [--backoff 0] [-- key=value ...]

Runs bazel-bin/examples/fashion_mnist (2 DDP ranks on CPU, real Fashion-MNIST) with
fabric.max_restarts=1, a checkpoint every 20 steps and a progress line every step; once the job
prints step 30, SIGKILLs rank 1 (found among the agent's children by FABRIC_LOCAL_RANK) and
measures, from the kill, when
  - the agent reports the failure ("fabric: restart 1 of 1 ..."),
  - rank 0 of the new attempt reports its resume ("restart 1: resumed from ..."),
  - the first progress line after the resume appears (the first step done again).
Prints one line per trial and the medians. Not a test: nothing is asserted.
"""
import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def children_rank(agent_pid, rank, attempt):
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                stat = f.read()
            ppid = int(stat[stat.rfind(")") + 2:].split()[1])
            if ppid != agent_pid:
                continue
            with open(f"/proc/{name}/environ", "rb") as f:
                env = dict(v.split(b"=", 1) for v in f.read().split(b"\0") if b"=" in v)
        except (OSError, ValueError, IndexError):
            continue
        if env.get(b"FABRIC_LOCAL_RANK") == str(rank).encode() and \
                env.get(b"FABRIC_RESTART_COUNT") == str(attempt).encode():
            return int(name)
    return None


def trial(binary, backoff, extra):
    with tempfile.TemporaryDirectory() as work:
        env = dict(os.environ, FABRIC_CONFIG_DIR=os.path.join(ROOT, "configs"))
        cmd = [binary, "--config=fashion_mnist.yaml", "fabric.devices=2", "fabric.max_restarts=1",
               f"fabric.restart_backoff_s={backoff}", "checkpoint.every_n_steps=20",
               "logging.log_every_n_steps=1", "logging.progress_bar=false", "trainer.max_steps=60",
               "logging.run_dir=runs/{timestamp}"] + extra
        job = subprocess.Popen(cmd, cwd=work, env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, bufsize=1)
        killed = reported = resumed = first_step = None
        lines = []
        for line in job.stdout:
            now = time.monotonic()
            lines.append(line)
            if killed is None and " step 30/" in line:
                victim = children_rank(job.pid, 1, 0)
                if victim is None:
                    raise SystemExit("rank 1 not found among the agent's children")
                os.kill(victim, signal.SIGKILL)
                killed = time.monotonic()
            elif killed is not None and reported is None and line.startswith("fabric: restart 1"):
                reported = now
            elif killed is not None and resumed is None and "restart 1: resumed" in line:
                resumed = now
            elif resumed is not None and first_step is None and " step " in line:
                first_step = now
        job.wait()
        if job.returncode != 0 or first_step is None:
            sys.stdout.write("".join(lines[-20:]))
            raise SystemExit(f"the job failed (exit {job.returncode})")
        return reported - killed, resumed - killed, first_step - killed


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--backoff", type=float, default=0.0, help="fabric.restart_backoff_s")
    parser.add_argument("--binary", default=os.path.join(ROOT, "bazel-bin/examples/fashion_mnist"))
    parser.add_argument("extra", nargs="*", help="more key=value overrides")
    args = parser.parse_args()
    results = []
    for t in range(args.trials):
        r = trial(args.binary, args.backoff, args.extra)
        results.append(r)
        print(f"trial {t + 1}: failure reported {r[0]:.3f} s, resumed {r[1]:.3f} s, "
              f"first step after resume {r[2]:.3f} s after the kill", flush=True)
    med = [statistics.median(x[i] for x in results) for i in range(3)]
    print(f"median of {args.trials}: failure reported {med[0]:.3f} s, resumed {med[1]:.3f} s, "
          f"first step {med[2]:.3f} s (fabric.restart_backoff_s={args.backoff})")


if __name__ == "__main__":
    main()
