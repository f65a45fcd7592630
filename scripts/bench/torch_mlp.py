#!/usr/bin/env python3
"""PyTorch peer for dtrain's CPU and GPU benchmarks: the same Fashion-MNIST MLP (or --model cnn,
or --model resnet) recipe, the same data preprocessing, the same LR rule, data preloaded in memory
as tensors.

  python3 torch_mlp.py --batch 64 --epochs 10 --threads 2               # plain PyTorch
  python3 torch_mlp.py --batch 64 --epochs 10 --threads 2 --ddp 4       # DDP, gloo, 4 processes
  python3 torch_mlp.py --batch 128 --epochs 5 --device cuda              # eager, on one GPU
  python3 torch_mlp.py --batch 128 --epochs 5 --device cuda --mode graph # whole step in a graph
  python3 torch_mlp.py --model resnet --widths 8,16,32 --batch 128 --lr 0.1 --base-batch 128
  python3 torch_mlp.py --model resnet --synthetic 3,32,32 --train-size 5120 --mode channels-last

--model resnet is dtrain's `model.type: resnet` (torchvision's block layout: bias-free
convolutions, BatchNorm, a 1x1 strided projection where a block changes shape, the CIFAR stem).
--synthetic C,H,W trains on random inputs of that shape (a throughput study: the labels are noise).

GPU modes (--mode): eager (the default optimizer, for-each), eager-fused (the fused optimizer),
graph (the whole training step, gather, forward, backward and fused optimizer, captured in one
CUDA graph after 3 warm-up steps and replayed), compile (torch.compile, default mode, fused
optimizer), compile-max (torch.compile mode="max-autotune", which also replays CUDA graphs).
CPU modes: eager (NCHW), channels-last (NHWC tensors and weights, oneDNN's preferred layout for
convolutions), compile (torch.compile with Inductor's C++ backend).
--precision bf16 runs the forward and the loss under autocast to bfloat16 (weights, gradients
and the update in FP32); --channels-last puts images and weights in NHWC on the GPU too.
Warm-up steps and captures count as training steps of the first epoch, so every mode trains the
same steps; the first epoch is reported separately from the steady-state median.

Prints one JSON line per epoch and a final JSON summary line (prefixed "SUMMARY ").
"""
import argparse
import contextlib
import gzip
import json
import math
import os
import statistics
import struct
import sys
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn


def read_idx(path):
    with gzip.open(path, "rb") if path.endswith(".gz") else open(path, "rb") as f:
        data = f.read()
    magic = struct.unpack(">I", data[:4])[0]
    ndim = magic & 0xFF
    dims = struct.unpack(">" + "I" * ndim, data[4:4 + 4 * ndim])
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def load(path):
    def f(name):
        p = os.path.join(path, name)
        return p if os.path.exists(p) else p + ".gz"
    xtr = read_idx(f("train-images-idx3-ubyte")).reshape(-1, 784).astype(np.float32) / 255.0
    ytr = read_idx(f("train-labels-idx1-ubyte")).astype(np.int64)
    xte = read_idx(f("t10k-images-idx3-ubyte")).reshape(-1, 784).astype(np.float32) / 255.0
    yte = read_idx(f("t10k-labels-idx1-ubyte")).astype(np.int64)
    # The same standardisation as dtrain: one mean and std over the training set.
    mean = xtr.astype(np.float64).mean()
    std = xtr.astype(np.float64).std()
    xtr = ((xtr - mean) / std).astype(np.float32)
    xte = ((xte - mean) / std).astype(np.float32)
    return (torch.from_numpy(xtr), torch.from_numpy(ytr), torch.from_numpy(xte),
            torch.from_numpy(yte))


def synthetic(args):
    c, h, w = (int(v) for v in args.synthetic.split(","))
    g = torch.Generator().manual_seed(args.seed)
    def make(n):
        return (torch.randn(n, c * h * w, generator=g),
                torch.randint(0, args.classes, (n,), generator=g))
    return (*make(args.train_size), *make(args.test_size))


def input_shape(args):
    if args.synthetic:
        return tuple(int(v) for v in args.synthetic.split(","))
    return (1, 28, 28)


def lr_at(args, global_batch, epoch_pos):
    ratio = global_batch / args.base_batch
    peak = args.lr * {"none": 1.0, "linear": ratio, "sqrt": math.sqrt(ratio)}[args.scaling]
    if epoch_pos < args.warmup:
        return args.lr + (peak - args.lr) * epoch_pos / args.warmup
    t = (epoch_pos - args.warmup) / max(1e-12, args.epochs - args.warmup)
    return peak * 0.5 * (1 + math.cos(math.pi * min(1.0, t)))


class ToImage(nn.Module):
    """Flat rows to C x H x W images; an image batch (channels-last mode) passes as it is."""

    def __init__(self, shape):
        super().__init__()
        self.shape = shape

    def forward(self, x):
        return x if x.dim() == 4 else x.view(-1, *self.shape)


class Block(nn.Module):
    """A basic (two 3x3) or bottleneck (1x1, 3x3, 1x1 x4) residual block, then ReLU."""

    def __init__(self, cin, width, stride, bottleneck):
        super().__init__()
        def conv(i, o, k, st):
            return nn.Conv2d(i, o, k, stride=st, padding=k // 2, bias=False)
        if bottleneck:
            out = 4 * width
            self.body = nn.Sequential(
                conv(cin, width, 1, 1), nn.BatchNorm2d(width), nn.ReLU(),
                conv(width, width, 3, stride), nn.BatchNorm2d(width), nn.ReLU(),
                conv(width, out, 1, 1), nn.BatchNorm2d(out))
        else:
            out = width
            self.body = nn.Sequential(
                conv(cin, width, 3, stride), nn.BatchNorm2d(width), nn.ReLU(),
                conv(width, width, 3, 1), nn.BatchNorm2d(width))
        self.shortcut = (nn.Identity() if stride == 1 and cin == out else
                         nn.Sequential(conv(cin, out, 1, stride), nn.BatchNorm2d(out)))
        self.out = out

    def forward(self, x):
        return torch.relu(self.body(x) + self.shortcut(x))


def resnet(args):
    """dtrain's resnet preset with the CIFAR stem: 3x3 conv, stages, global average pool."""
    stages = {18: [2, 2, 2, 2], 34: [3, 4, 6, 3], 50: [3, 4, 6, 3]}.get(args.depth)
    if stages is None:
        stages = [(args.depth - 2) // 6] * 3
    widths = [int(v) for v in args.widths.split(",")]
    bottleneck = args.depth == 50
    c = input_shape(args)[0]
    layers = [ToImage(input_shape(args)), nn.Conv2d(c, widths[0], 3, padding=1, bias=False),
              nn.BatchNorm2d(widths[0]), nn.ReLU()]
    cin = widths[0]
    for s, (n, w) in enumerate(zip(stages, widths)):
        for b in range(n):
            block = Block(cin, w, 2 if s > 0 and b == 0 else 1, bottleneck)
            layers.append(block)
            cin = block.out
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, args.classes)]
    return nn.Sequential(*layers)


def build_model(args):
    if args.model == "resnet":
        return resnet(args)
    if args.model == "cnn":
        # dtrain's `cnn` preset: two conv-BN-ReLU-pool blocks, dense 128, dropout, classifier.
        return nn.Sequential(
            nn.Unflatten(1, (1, 28, 28)),
            nn.Conv2d(1, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(2),
            nn.Flatten(), nn.Linear(3136, 128), nn.ReLU(), nn.Dropout(args.dropout),
            nn.Linear(128, 10))
    return nn.Sequential(nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 128), nn.ReLU(),
                         nn.Linear(128, 10))


class BatchPrep:
    """What a gathered batch goes through before the forward, the same in every mode: the
    layout (channels-last: flat rows to NHWC images, as a user's data loader would hand them)
    and the forward's precision (bf16: autocast, weights, gradients and the update in FP32, as
    dtrain's precision: bf16 keeps its master weights in FP32)."""

    def __init__(self, args):
        self.shape = input_shape(args)
        self.channels_last = args.mode == "channels-last" or args.channels_last
        self.bf16 = args.precision == "bf16"
        self.device_type = torch.device(args.device).type

    def __call__(self, xb):
        if not self.channels_last:
            return xb
        return xb.view(-1, *self.shape).contiguous(memory_format=torch.channels_last)

    def autocast(self):
        if not self.bf16:
            return contextlib.nullcontext()
        # The cast cache off: PyTorch's advice for autocast inside a CUDA graph capture.
        return torch.autocast(self.device_type, dtype=torch.bfloat16, cache_enabled=False)


class GraphedStep:
    """The whole training step in one CUDA graph: the batch gather from a static index buffer,
    forward, loss, backward, the fused SGD update with the learning rate read from a device
    tensor, and the running loss sum. The first `warmup` calls run eagerly on a side stream
    (PyTorch's whole-network capture recipe), the next captures and replays."""

    def __init__(self, model, opt, loss_fn, xtr, ytr, global_batch, lr_t, prep, warmup=3):
        self.model, self.opt, self.loss_fn, self.xtr, self.ytr = model, opt, loss_fn, xtr, ytr
        self.prep = prep  # the batch's layout and the forward's precision (see run)
        self.idx = torch.zeros(global_batch, dtype=torch.int64, device=xtr.device)
        self.loss_sum = torch.zeros((), device=xtr.device)
        self.lr_t, self.warmup, self.calls, self.graph = lr_t, warmup, 0, None

    def body(self):
        self.opt.zero_grad(set_to_none=True)
        with self.prep.autocast():
            loss = self.loss_fn(self.model(self.prep(self.xtr[self.idx])), self.ytr[self.idx])
        loss.backward()
        self.opt.step()
        self.loss_sum += loss.detach()

    def __call__(self, idx, lr):
        self.idx.copy_(idx, non_blocking=True)
        self.lr_t.fill_(lr)
        if self.graph is not None:
            self.graph.replay()
        elif self.calls < self.warmup:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                self.body()
            torch.cuda.current_stream().wait_stream(side)
        else:
            self.opt.zero_grad(set_to_none=True)
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph):
                self.body()
            self.graph.replay()
        self.calls += 1


def run(rank, world, args):
    torch.set_num_threads(max(1, args.threads // world))
    dev = torch.device(args.device)
    if world > 1:
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(args.port))
        dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(args.seed)
    if dev.type == "cuda":
        # The same arithmetic as dtrain's precision: fp32 is strict FP32 in GEMMs and
        # convolutions (TF32 off), tf32 allows TF32 tensor cores in both. cuDNN picks its
        # fastest algorithms (benchmark mode), PyTorch's fastest ordinary setting.
        tf32 = args.precision == "tf32"
        torch.backends.cuda.matmul.allow_tf32 = tf32
        torch.backends.cudnn.allow_tf32 = tf32
        torch.backends.cudnn.benchmark = True
    data = synthetic(args) if args.synthetic else load(args.data)
    xtr, ytr, xte, yte = (t.to(dev) for t in data)  # data preloaded on the device
    model = build_model(args).to(dev)
    prep = BatchPrep(args)
    if prep.channels_last:
        # The model's convolution weights in NHWC; each batch is converted after the gather
        # inside the timed step.
        model = model.to(memory_format=torch.channels_last)
    if world > 1:
        model = nn.parallel.DistributedDataParallel(model)
    fused = args.mode != "eager" and dev.type == "cuda"
    # graph: the learning rate lives in a device tensor that the captured update reads.
    lr_t = torch.tensor(args.lr, device=dev) if args.mode == "graph" else args.lr
    opt = torch.optim.SGD(model.parameters(), lr=lr_t, momentum=args.momentum,
                          weight_decay=args.weight_decay,
                          **({"fused": True} if fused else {}))
    loss_fn = nn.CrossEntropyLoss()
    train_model = model
    if args.mode.startswith("compile"):
        train_model = torch.compile(
            model, mode="max-autotune" if args.mode == "compile-max" else None)
    global_batch = args.batch * world
    steps = xtr.shape[0] // global_batch
    gen = torch.Generator().manual_seed(args.seed)
    graphed = (GraphedStep(model, opt, loss_fn, xtr, ytr, global_batch, lr_t, prep)
               if args.mode == "graph" else None)
    times = []
    for epoch in range(args.epochs):
        perm = torch.randperm(xtr.shape[0], generator=gen).to(dev)  # same on every rank
        model.train()
        if world > 1:
            dist.barrier()
        if dev.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        loss_sum = torch.zeros((), device=dev)
        if graphed is not None:
            graphed.loss_sum.zero_()
            loss_sum = graphed.loss_sum
        for s in range(steps):
            lr = lr_at(args, global_batch, epoch + s / steps)
            # Interleaved sharding of the global batch, as dtrain does by default.
            idx = perm[s * global_batch + rank:(s + 1) * global_batch:world]
            if graphed is not None:
                graphed(idx, lr)
                continue
            for g in opt.param_groups:
                g["lr"] = lr
            xb, yb = prep(xtr[idx]), ytr[idx]
            opt.zero_grad(set_to_none=True)
            with prep.autocast():
                loss = loss_fn(train_model(xb), yb)
            loss.backward()
            opt.step()
            loss_sum += loss.detach()
        if dev.type == "cuda":
            torch.cuda.synchronize()
        if world > 1:
            dist.barrier()
        dt = time.perf_counter() - t0
        times.append(dt)
        model.eval()
        with torch.no_grad(), prep.autocast():
            # In chunks of 1000, dtrain's eval_batch: a ResNet on all 10,000 images at once
            # would hold gigabytes of activations.
            hits = sum((model(xte[i:i + 1000]).argmax(1) == yte[i:i + 1000]).sum().item()
                       for i in range(0, xte.shape[0], 1000))
            acc = hits / xte.shape[0]
        if rank == 0:
            print(json.dumps({"epoch": epoch + 1, "epoch_time_s": dt, "test_acc": acc,
                              "train_loss": (loss_sum / steps).item()}), flush=True)
    if rank == 0:
        name = "pytorch-ddp-gloo" if world > 1 else "pytorch"
        if dev.type == "cuda":
            name += "-cuda-" + args.mode
        # Steady state: the median of the epochs after the first (warm-up, capture, compile).
        steady = statistics.median(times[1:]) if len(times) > 1 else times[0]
        print("SUMMARY " + json.dumps({"framework": name, "mode": args.mode,
                                       "torch": torch.__version__, "replicas": world,
                                       "batch": args.batch, "threads": args.threads,
                                       "median_epoch_time_s": statistics.median(times),
                                       "first_epoch_time_s": times[0],
                                       "steady_epoch_time_s": steady,
                                       "final_test_acc": acc}),
              flush=True)
    if world > 1:
        dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    p.add_argument("--batch", type=int, default=64, help="per-replica batch")
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--threads", type=int, default=2, help="CPU threads in total")
    p.add_argument("--ddp", type=int, default=1, help="processes (DDP with gloo when > 1)")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--base-batch", type=int, default=64)
    p.add_argument("--scaling", choices=["none", "linear", "sqrt"], default="linear")
    p.add_argument("--warmup", type=float, default=2.0)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--model", choices=["mlp", "cnn", "resnet"], default="mlp")
    p.add_argument("--depth", type=int, default=20, help="resnet: 6n+2, 18, 34 or 50")
    p.add_argument("--widths", default="16,32,64", help="resnet: one width per stage")
    p.add_argument("--synthetic", default="", help="C,H,W: random inputs of this shape")
    p.add_argument("--train-size", type=int, default=4096, help="--synthetic only")
    p.add_argument("--test-size", type=int, default=1024, help="--synthetic only")
    p.add_argument("--classes", type=int, default=10)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--weight-decay", type=float, default=5e-4)
    p.add_argument("--dropout", type=float, default=0.25, help="cnn only")
    p.add_argument("--port", type=int, default=29533)
    p.add_argument("--device", default="cpu", help="cpu or cuda (PyTorch on one GPU)")
    p.add_argument("--mode", default="eager",
                   choices=["eager", "eager-fused", "graph", "compile", "compile-max",
                            "channels-last"],
                   help="how the step runs (see the top of this file)")
    p.add_argument("--precision", default="fp32", choices=["fp32", "tf32", "bf16"],
                   help="fp32 keeps TF32 off in GEMMs and convolutions (GPU); bf16 runs the "
                        "forward under autocast to bfloat16")
    p.add_argument("--channels-last", action="store_true",
                   help="GPU: images and convolution weights in NHWC (the CPU's mode "
                        "channels-last does the same)")
    args = p.parse_args()
    cpu_modes = ["eager", "channels-last", "compile"]
    gpu_modes = ["eager", "eager-fused", "graph", "compile", "compile-max"]
    if args.mode not in (cpu_modes if args.device == "cpu" else gpu_modes):
        p.error(f"--mode {args.mode} is not a {args.device} mode")
    if args.mode != "eager" and args.ddp > 1:
        p.error("--mode other than eager needs one process")
    if args.ddp > 1:
        mp.spawn(run, args=(args.ddp, args), nprocs=args.ddp, join=True)
    else:
        run(0, 1, args)


if __name__ == "__main__":
    sys.exit(main())
