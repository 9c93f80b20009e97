"""The Python side of tools/bench/loader_throughput.cc: images (or rows) per second that PyTorch's
own DataLoader delivers, with nothing else running.

  --format image_folder --root DIR   torchvision.datasets.ImageFolder(DIR) with
                                     RandomResizedCrop(S, antialias=True), RandomHorizontalFlip and
                                     PILToTensor: uint8 [B, 3, S, S], as the C++ side delivers
  --format npy --root DIR            TensorDataset over np.load(DIR/inputs.npy, mmap_mode='r')
  --format webdataset --shards PATTERN  the webdataset package (pip install webdataset): shards
                                     streamed, split over the workers, a 1000-sample shuffle
                                     buffer, decoded with PIL and the image_folder transforms

Workers are processes (num_workers); each uses one intra-op thread (DataLoader's default).
Prints one line: "images_per_second=X batches=N workers=W seconds=T".
"""
import argparse
import time

import numpy as np
import torch
from torch.utils.data import DataLoader, TensorDataset


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--format", default="image_folder", choices=["image_folder", "npy", "webdataset"])
    p.add_argument("--root", default="")
    p.add_argument("--shards", default="")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--batch_size", type=int, default=64)
    p.add_argument("--image_size", type=int, default=224)
    p.add_argument("--epochs", type=int, default=1)
    a = p.parse_args()
    if a.format == "npy":
        x = torch.from_numpy(np.load(f"{a.root}/inputs.npy", mmap_mode="r"))
        y = torch.from_numpy(np.load(f"{a.root}/targets.npy").astype(np.int64))
        data = TensorDataset(x, y)
    else:
        from torchvision import datasets, transforms

        transform = transforms.Compose([
            transforms.RandomResizedCrop(a.image_size, antialias=True),
            transforms.RandomHorizontalFlip(),
            transforms.PILToTensor(),
        ])
        if a.format == "image_folder":
            data = datasets.ImageFolder(a.root, transform)
    if a.format == "webdataset":
        import webdataset as wds

        data = (wds.WebDataset(a.shards, shardshuffle=100, nodesplitter=wds.single_node_only)
                .shuffle(1000).decode("pil").to_tuple("jpg", "cls").map_tuple(transform, int))
        loader = wds.WebLoader(data, batch_size=a.batch_size, num_workers=a.workers,
                               prefetch_factor=2 if a.workers > 0 else None)
    else:
        loader = DataLoader(data, batch_size=a.batch_size, shuffle=True, num_workers=a.workers,
                            prefetch_factor=2 if a.workers > 0 else None,
                            persistent_workers=False)
    start = time.perf_counter()
    images = batches = 0
    for _ in range(a.epochs):
        for x, _ in loader:
            images += x.shape[0]
            batches += 1
    seconds = time.perf_counter() - start
    print(f"images_per_second={images / seconds:.1f} batches={batches} workers={a.workers} "
          f"seconds={seconds:.2f}")


if __name__ == "__main__":
    main()
