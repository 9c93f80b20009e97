"""Runs a command and prints the peak memory of its whole process tree (worker processes
included) as the sum of each process's PSS (proportional set size: pages shared between processes,
such as the libraries a forked worker shares with its parent, are divided among them, so nothing
is counted twice). Sampled every 20 ms from /proc/PID/smaps_rollup.
  python3 tools/bench/peak_memory.py -- COMMAND [ARGS...]
Prints the command's output, then "peak_pss_mib=X"; exits with the command's status.
"""
import os
import subprocess
import sys
import time


def children(pid):
    out = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as f:
                out += [int(c) for c in f.read().split()]
    except OSError:
        pass
    return out


def pss_kib(pid):
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def main():
    argv = sys.argv[1:]
    if argv[:1] == ["--"]:
        argv = argv[1:]
    proc = subprocess.Popen(argv)
    peak = 0
    while proc.poll() is None:
        tree, todo = [], [proc.pid]
        while todo:
            pid = todo.pop()
            tree.append(pid)
            todo += children(pid)
        peak = max(peak, sum(pss_kib(p) for p in tree))
        time.sleep(0.02)
    print(f"peak_pss_mib={peak / 1024:.1f}", flush=True)
    sys.exit(proc.returncode)


if __name__ == "__main__":
    main()
