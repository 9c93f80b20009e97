"""Rewrites a .cu file for tools/cuda_emu/shim.h: its CUDA runtime include becomes the shim's,
every `kernel<<<grid, block, shared, stream>>>(args)` becomes
`fabric_emu::launch(dim3(grid), dim3(block), shared, [&] { kernel(args); })`, and every
`extern __shared__ T name[];` a pointer into the launch's dynamic shared memory.

Usage: python3 launches.py in.cu > out.cc
"""
import re
import sys


def split_top(text, sep):
    parts, depth, cur = [], 0, ""
    for c in text:
        depth += c in "(<[{"
        depth -= c in ")>]}"
        if c == sep and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += c
    return parts + [cur]


def rewrite(s):
    s = s.replace("#include <cuda_runtime.h>", '#include "tools/cuda_emu/shim.h"')
    s = re.sub(r"extern __shared__ (\w+) (\w+)\[\];",
               r"\1* \2 = reinterpret_cast<\1*>(fabric_emu::dynamic_shared.data());", s)
    out, i = [], 0
    while True:
        j = s.find("<<<", i)
        if j < 0:
            out.append(s[i:])
            return "".join(out)
        k, depth = j, 0  # the kernel's name, template arguments included
        while True:
            c = s[k - 1]
            if c == ">":
                depth += 1
            elif c == "<":
                depth -= 1
            elif c in " \n\t(;{" and depth == 0:
                break
            k -= 1
        end = s.index(">>>", j)
        config = split_top(s[j + 3:end], ",")
        a = end + 3
        if s[a] != "(":
            sys.exit("launches.py: expected '(' after >>> at offset %d" % a)
        m, depth = a, 0
        while True:
            depth += s[m] == "("
            depth -= s[m] == ")"
            if depth == 0:
                break
            m += 1
        out.append(s[i:k])
        shared = config[2].strip() if len(config) > 2 else "0"
        out.append("fabric_emu::launch(dim3(%s), dim3(%s), %s, [&] { %s(%s); })"
                   % (config[0].strip(), config[1].strip(), shared, s[k:j], s[a + 1:m]))
        i = m + 1


if __name__ == "__main__":
    sys.stdout.write(rewrite(open(sys.argv[1]).read()))
