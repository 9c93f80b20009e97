"""Training throughput of the Python anchors, the counterpart of tools/bench/throughput.cc.

  python3 tools/bench/throughput.py --framework=raw|compile|lightning|accelerate \
      --model=resnet18 --batch=512 --precision=bf16-mixed [--steps=50 --warmup=15] \
      [--data=static|epoch --images=50000] [--channels_last] [--device=cuda] \
      [--profile=trace.json --profile_steps=8]

Same model definitions (tools/bench/models.py = examples/common/models.cc), optimizer (SGD lr 0.1,
momentum 0.9, Nesterov, weight decay 5e-4; each framework's default implementation), loss
(cross-entropy) and data as throughput.cc:
  static  a pool of 4 synthetic normalized float batches already on the device, cycled;
  epoch   a synthetic uint8 dataset of --images images kept on the device, shuffled each epoch,
          random crop (pad 4) + flip + normalize on the device; --steps is ignored, one whole
          epoch is timed after --warmup steps (the ResNet-50 epoch benchmark).
Prints one line: RESULT {"images_per_s": ..., "step_ms": ..., "peak_device_mib": ...,
"peak_rss_mib": ..., ...} (JSON). gpu_compare.py runs it beside the C++ side.
"""
import argparse
import contextlib
import json
import os
import resource
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import models  # noqa: E402

MEAN = torch.tensor([0.4914, 0.4822, 0.4465]).view(1, 3, 1, 1) * 255
STD = torch.tensor([0.2470, 0.2435, 0.2616]).view(1, 3, 1, 1) * 255


def sgd(model):
    """The benchmark's optimizer (throughput.cc's), each framework's default implementation."""
    return torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, nesterov=True,
                           weight_decay=5e-4)


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def crop_flip_normalize(images, pad):
    """The same whole-batch gather as fabric/data/augment.cc."""
    n, c, h, w = images.shape
    dy = torch.randint(0, 2 * pad + 1, (n,), device=images.device)
    dx = torch.randint(0, 2 * pad + 1, (n,), device=images.device)
    flip = torch.rand(n, device=images.device) < 0.5
    padded = F.pad(images, (pad, pad, pad, pad))
    ys = torch.arange(h, device=images.device).view(1, h, 1)
    xs = torch.arange(w, device=images.device).view(1, 1, w)
    rows = dy.view(n, 1, 1) + ys
    cols = dx.view(n, 1, 1) + torch.where(flip.view(n, 1, 1), (w - 1) - xs, xs)
    flat = (rows * (w + 2 * pad) + cols).view(n, 1, h * w).expand(n, c, h * w)
    out = padded.flatten(2).gather(2, flat).view(n, c, h, w)
    return (out.float() - MEAN.to(images.device)) / STD.to(images.device)


def batches(args, device):
    """An iterator of (input, target) and the number of timed steps."""
    g = torch.Generator(device="cpu").manual_seed(0)
    if args.data == "static":
        pool = [(torch.randn(args.batch, 3, 32, 32, generator=g).to(device),
                 torch.randint(0, 10, (args.batch,), generator=g).to(device)) for _ in range(4)]

        def gen():
            i = 0
            while True:
                yield pool[i % 4]
                i += 1
        return gen(), args.steps
    images = torch.randint(0, 256, (args.images, 3, 32, 32), generator=g,
                           dtype=torch.uint8).to(device)
    labels = torch.randint(0, 10, (args.images,), generator=g).to(device)
    steps = (args.images + args.batch - 1) // args.batch

    def gen():
        while True:
            order = torch.randperm(args.images, device=device)
            for b in range(steps):
                idx = order[b * args.batch:(b + 1) * args.batch]
                yield crop_flip_normalize(images.index_select(0, idx), 4), labels[idx]
    return gen(), steps


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--framework", default="raw", choices=["raw", "compile", "lightning", "accelerate"])
    p.add_argument("--model", default="resnet18", choices=["resnet18", "resnet50"])
    p.add_argument("--batch", type=int, default=512)
    p.add_argument("--precision", default="32-true", choices=["32-true", "bf16-mixed", "16-mixed"])
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--warmup", type=int, default=15)
    p.add_argument("--data", default="static", choices=["static", "epoch"])
    p.add_argument("--images", type=int, default=50000)
    p.add_argument("--channels_last", action="store_true")
    p.add_argument("--device", default="cuda")
    p.add_argument("--profile", default="",
                   help="diagnosis: Chrome trace of --profile_steps timed steps from step 20 "
                        "(tools/bench/trace_summary.py reads it)")
    p.add_argument("--profile_steps", type=int, default=8)
    p.add_argument("--threads", type=int, default=0, help="CPU intra-op threads (0: torch's default)")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.backends.cudnn.benchmark = True
    device = torch.device(args.device)
    torch.manual_seed(0)
    model = models.make(args.model)
    memory_format = torch.channels_last if args.channels_last else torch.contiguous_format

    autocast = contextlib.nullcontext
    scaler = None
    amp_dtype = {"bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}.get(args.precision)
    if args.framework in ("raw", "compile"):
        model = model.to(device, memory_format=memory_format)
        opt = sgd(model)
        if args.framework == "compile":
            model = torch.compile(model)
        if amp_dtype is not None:
            autocast = lambda: torch.autocast(device.type, dtype=amp_dtype)  # noqa: E731
        if args.precision == "16-mixed":
            scaler = torch.amp.GradScaler(device.type)

        def backward(loss):
            (scaler.scale(loss) if scaler else loss).backward()

        def step():
            if scaler:
                scaler.step(opt)
                scaler.update()
            else:
                opt.step()
    elif args.framework == "lightning":
        from lightning.fabric import Fabric
        fabric = Fabric(accelerator=device.type, devices=1, precision=args.precision)
        model = model.to(memory_format=memory_format)
        opt = sgd(model)
        model, opt = fabric.setup(model, opt)
        autocast = fabric.autocast
        backward = fabric.backward
        step = opt.step
    else:
        from accelerate import Accelerator
        acc = Accelerator(cpu=device.type == "cpu",
                          mixed_precision={"32-true": "no", "bf16-mixed": "bf16",
                                           "16-mixed": "fp16"}[args.precision])
        model = model.to(memory_format=memory_format)
        opt = sgd(model)
        model, opt = acc.prepare(model, opt)
        autocast = acc.autocast
        backward = acc.backward
        step = opt.step

    data, timed_steps = batches(args, device)

    def train_step():
        x, y = next(data)
        if args.channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        opt.zero_grad(set_to_none=True)
        with autocast():
            loss = F.cross_entropy(model(x), y)
        backward(loss)
        step()

    model.train()
    for _ in range(args.warmup):
        train_step()
    sync(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    t0 = time.perf_counter()
    first = min(20, timed_steps // 2)
    prof = None
    for s in range(timed_steps):
        if args.profile and s == first:
            sync(device)
            prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU] + (
                [torch.profiler.ProfilerActivity.CUDA] if device.type == "cuda" else []))
            prof.__enter__()
        with torch.profiler.record_function("train_step") if prof else contextlib.nullcontext():
            train_step()
        if prof is not None and s + 1 == first + args.profile_steps:
            sync(device)
            prof.__exit__(None, None, None)
            prof.export_chrome_trace(args.profile)
            print(f"throughput.py: wrote the trace {args.profile}", file=sys.stderr)
            prof = None
    sync(device)
    seconds = time.perf_counter() - t0
    images = timed_steps * args.batch if args.data == "static" else args.images
    result = {
        "framework": args.framework, "model": args.model, "batch": args.batch,
        "precision": args.precision, "data": args.data, "channels_last": args.channels_last,
        "parameters": models.parameter_count(model), "steps": timed_steps, "seconds": seconds, "images_per_s": images / seconds,
        "step_ms": 1000 * seconds / timed_steps,
        "peak_device_mib": (torch.cuda.max_memory_allocated(device) / 2**20
                            if device.type == "cuda" else 0.0),
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "torch": torch.__version__,
        "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
    }
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
