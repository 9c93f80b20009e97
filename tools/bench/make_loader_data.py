"""Writes the data of the loading benchmark (docs/benchmarks.md, "Data loading"):
  OUT/images/<class>/<n>.jpg   --images JPEGs (Pillow, quality 90) of random sizes 64-256 px per
                               side in 10 classes: smooth colour patterns plus noise, so they
                               compress like photos rather than like noise or flat colour
  OUT/npy/inputs.npy           --rows uint8 images [N, 3, 32, 32] and targets.npy int64 labels
  OUT/shards/train-NNN.tar     the same JPEGs as WebDataset shards (--shards of them, in a
                               shuffled order, KEY.jpg + KEY.cls), as webdataset's writers lay
                               them out
Deterministic (seed 0).  python3 tools/bench/make_loader_data.py --out /tmp/loader_data
"""
import argparse
import io
import os
import tarfile

import numpy as np
from PIL import Image


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--images", type=int, default=20000)
    p.add_argument("--rows", type=int, default=200000)
    p.add_argument("--shards", type=int, default=20)
    a = p.parse_args()
    rng = np.random.default_rng(0)
    for i in range(a.images):
        h, w = rng.integers(64, 257, size=2)
        yy, xx = np.mgrid[0:h, 0:w]
        f = rng.uniform(0.02, 0.2, size=(3, 2))
        planes = [127 + 100 * np.sin(xx * f[c, 0] + yy * f[c, 1] + c) for c in range(3)]
        img = np.clip(np.stack(planes, -1) + rng.normal(0, 12, (h, w, 3)), 0, 255).astype(np.uint8)
        d = f"{a.out}/images/class{i % 10}"
        os.makedirs(d, exist_ok=True)
        Image.fromarray(img).save(f"{d}/{i:06d}.jpg", quality=90)
    os.makedirs(f"{a.out}/shards", exist_ok=True)
    order = np.random.default_rng(1).permutation(a.images)
    for s, part in enumerate(np.array_split(order, a.shards)):
        with tarfile.open(f"{a.out}/shards/train-{s:03d}.tar", "w") as tar:
            for i in part:
                jpg = open(f"{a.out}/images/class{i % 10}/{i:06d}.jpg", "rb").read()
                for name, data in ((f"{i:06d}.jpg", jpg), (f"{i:06d}.cls", str(i % 10).encode())):
                    info = tarfile.TarInfo(name)
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
    os.makedirs(f"{a.out}/npy", exist_ok=True)
    np.save(f"{a.out}/npy/inputs.npy", rng.integers(0, 256, (a.rows, 3, 32, 32), dtype=np.uint8))
    np.save(f"{a.out}/npy/targets.npy", rng.integers(0, 10, a.rows).astype(np.int64))


if __name__ == "__main__":
    main()
