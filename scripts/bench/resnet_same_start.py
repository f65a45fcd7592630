#!/usr/bin/env python3
"""Is dtrain's ResNet training the same computation as PyTorch's? A check from shared states.

dtrain trains configs/fmnist-resnet.yaml (ResNet-20: convolutions, BatchNorm inside residual
blocks, SGD with momentum and weight decay, warmup then cosine) with data.shuffle none and flips
and crops off, so every epoch visits the training images in order, in batches that PyTorch can
take in the same order. dtrain's state after each of its first K steps (weights, momentum
buffers, BatchNorm's running statistics) comes from runs that the test fault hook
(DTRAIN_FAULT=0:k+1) stops after step k, with a checkpoint every step: a failed run keeps its
last. PyTorch (torch_mlp.py's resnet, torchvision's block layout) loads them
(dtrain_checkpoint.load_resnet), with dtrain's options where they are given
(--no-decay-bn-and-bias: weight decay on weights only, as parameter groups; --label-smoothing).

1. Steps. From dtrain's state after step k - 1, PyTorch computes step k in float64: the loss,
   the gradient and the running statistics that dtrain's step k should give, but for rounding.
   dtrain's own step k is read from its next state: the loss from the step's statistics, the
   gradient from the momentum buffers (m_k = 0.9 m_(k-1) + g + decay p_(k-1), PyTorch's SGD),
   the update from the weights (p_k = p_(k-1) - lr_k m_k). PyTorch's float32 step from the same
   state shows how far float32 rounding alone moves each of them. Twice: with GELU in place of
   every ReLU in both programs (model.activation: gelu), a smooth network where that distance
   is rounding alone, held to 3x PyTorch's; and with the config's ReLUs, where float32 and
   float64 can pass a ReLU's kink on different sides and the gradient's distance jumps from
   step to step in either program, held to 10x.
2. Epochs. From dtrain's state after step 1, PyTorch trains the rest of the epochs on the same
   batches in float32 and in float64, and from its own initial weights, for scale: how far the
   trajectories drift apart from rounding alone, against a change of initial weights.

Usage: resnet_same_start.py [--epochs 3] [--train-limit 6016] [--test-limit 2000] [--steps 8]
       [--no-decay-bn-and-bias] [--label-smoothing 0.1] [--stem resnet-same-start]
       [--dtrain-set KEY=VALUE ...]
"""
import argparse
import contextlib
import csv
import json
import math
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import types

import numpy as np
import torch
import torch.nn as nn

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
import dtrain_checkpoint  # noqa: E402
import torch_mlp  # noqa: E402

CONFIG = os.path.join(ROOT, "configs", "fmnist-resnet.yaml")
RESNET = types.SimpleNamespace(depth=20, widths="16,32,64", synthetic=None, classes=10)
# The recipe of configs/fmnist-resnet.yaml at one replica x 128 (linear scaling leaves lr as it
# is at the base batch).
LR, MOMENTUM, WEIGHT_DECAY, WARMUP, BATCH = 0.1, 0.9, 5e-4, 1.0, 128


def dtrain_cmd(args, results, tag, extra=()):
    sets = [f"data.path={args.data}", "data.shuffle=none", "data.augment.flip=false",
            "data.augment.crop_padding=0", f"data.train_limit={args.train_limit}",
            f"data.test_limit={args.test_limit}", f"train.epochs={args.epochs}",
            f"train.seed={args.seed}", f"train.label_smoothing={args.label_smoothing}",
            f"optimizer.decay_bn_and_bias={'true' if args.decay_bn_and_bias else 'false'}",
            *extra]
    for s in args.dtrain_set:  # replaces the check's own setting of that key (dtrain takes one)
        sets = [o for o in sets if o.split("=", 1)[0] != s.split("=", 1)[0]] + [s]
    return [args.dtrain, "run", CONFIG, "backend=cpu", "gpus=1", f"threads={args.threads}",
            *sets, "--results", results, "--tag", tag, "--quiet"]


def dtrain_epochs(results, tag):
    with open(os.path.join(results, "fmnist-resnet", f"{tag}-g1", "metrics.csv")) as f:
        return [dict(epoch=int(r["epoch"]), train_loss=float(r["train_loss"]),
                     test_loss=float(r["test_loss"]), test_acc=float(r["test_acc"]))
                for r in csv.DictReader(f)]


def dtrain_checkpoint_after(args, results, k, activation):
    """dtrain's state after step k: a run that the fault hook stops at step k + 1, with a
    checkpoint every step (a failed run keeps its last)."""
    env = dict(os.environ, DTRAIN_FAULT=f"0:{k + 1}")
    tag = f"{activation}-step{k}"
    cmd = dtrain_cmd(args, results, tag,
                     ["train.checkpoint_steps=1", f"model.activation={activation}"])
    p = subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    path = os.path.join(results, "fmnist-resnet", f"{tag}-g1", "checkpoint.bin")
    if p.returncode == 0 or not os.path.exists(path):
        raise SystemExit(f"no checkpoint after step {k} (dtrain exit {p.returncode}):\n"
                         f"{p.stderr[-2000:]}")
    return dtrain_checkpoint.read_checkpoint(path)


def lr_at(args, epoch_pos):
    """dtrain's lr_at for this recipe: warmup from lr to the peak (lr itself at the base batch),
    then the cosine to 0."""
    if epoch_pos < WARMUP:
        return LR
    frac = min(1.0, max(0.0, (epoch_pos - WARMUP) / max(1e-12, args.epochs - WARMUP)))
    return LR * 0.5 * (1 + math.cos(math.pi * frac))


def load_data(args):
    """Fashion-MNIST as dtrain reads it with the limits: pixels / 255, then one mean and std
    over the kept training images (population std), applied to both splits."""
    def idx(name):
        p = os.path.join(args.data, name)
        return torch_mlp.read_idx(p if os.path.exists(p) else p + ".gz")
    xtr = idx("train-images-idx3-ubyte")[:args.train_limit].reshape(-1, 784) / np.float32(255)
    xte = idx("t10k-images-idx3-ubyte")[:args.test_limit].reshape(-1, 784) / np.float32(255)
    ytr = idx("train-labels-idx1-ubyte")[:args.train_limit].astype(np.int64)
    yte = idx("t10k-labels-idx1-ubyte")[:args.test_limit].astype(np.int64)
    v = xtr.astype(np.float64)
    mean = v.mean()
    std = math.sqrt(max(1e-12, (v * v).mean() - mean * mean))
    prep = [torch.from_numpy(((x.astype(np.float64) - mean) / std).astype(np.float32))
            for x in (xtr, xte)]
    return prep[0], torch.from_numpy(ytr), prep[1], torch.from_numpy(yte)


def make_optimizer(model, args):
    if args.decay_bn_and_bias:
        groups = [{"params": list(model.parameters()), "weight_decay": WEIGHT_DECAY}]
    else:  # weights (convolution and dense kernels) decay, BatchNorm and biases do not
        groups = [{"params": [p for p in model.parameters() if p.dim() >= 2],
                   "weight_decay": WEIGHT_DECAY},
                  {"params": [p for p in model.parameters() if p.dim() < 2],
                   "weight_decay": 0.0}]
    return torch.optim.SGD(groups, lr=LR, momentum=MOMENTUM)


@torch.no_grad()
def evaluate(model, xte, yte):
    """Test loss (plain cross-entropy, as dtrain scores) and accuracy, BatchNorm's running
    statistics, in chunks of 1000."""
    model.eval()
    loss, hits = 0.0, 0
    for i in range(0, xte.shape[0], 1000):
        out = model(xte[i:i + 1000])
        loss += nn.functional.cross_entropy(out, yte[i:i + 1000], reduction="sum").item()
        hits += (out.argmax(1) == yte[i:i + 1000]).sum().item()
    model.train()
    return loss / xte.shape[0], hits / xte.shape[0]


def build(args, ckpt=None, dtype=torch.float32):
    """PyTorch's ResNet and SGD: from PyTorch's own initial weights, or from dtrain's state in
    `ckpt`; in `dtype` (float64: the reference that rounding errors are measured against)."""
    torch.manual_seed(args.seed)
    model = torch_mlp.resnet(RESNET)
    opt = make_optimizer(model, args)
    if ckpt is not None:
        dtrain_checkpoint.load_resnet(model, opt, ckpt)
    model.to(dtype)  # the same Parameter objects, converted in place
    for st in opt.state.values():
        st["momentum_buffer"] = st["momentum_buffer"].to(dtype)
    return model, opt


def flat(pairs):
    """The tensors of resnet_tensors' `pairs` as one float64 vector in dtrain's order."""
    return torch.cat([(t.detach().t() if tr else t.detach()).reshape(-1).double()
                      for t, tr in pairs]).numpy()


def running_stats(norms):
    return torch.cat([torch.cat([n.running_mean, n.running_var]).double()
                      for n in norms]).numpy()


def rel(a, b):
    """The relative difference of a against the reference b, in the 2-norm."""
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-300))


def torch_step(args, state, k, data, dtype):
    """From dtrain's state after step k - 1, PyTorch's step k in `dtype`: its loss, gradient and
    BatchNorm running statistics after the step's forward."""
    xtr, ytr = data[0], data[1]
    model, _ = build(args, state, dtype)
    pairs, norms = dtrain_checkpoint.resnet_tensors(model)
    lo = (k - 1) * BATCH
    loss = nn.CrossEntropyLoss(label_smoothing=args.label_smoothing)(
        model(xtr[lo:lo + BATCH].to(dtype)), ytr[lo:lo + BATCH])
    loss.backward()
    return loss.item(), flat([(t.grad, tr) for t, tr in pairs]), running_stats(norms)


class Smooth(nn.Module):
    """A smooth stand-in for ReLU: GELU with the tanh approximation (dtrain's model.activation:
    gelu) or softplus with a sharp knee (ReLU's shape without its kink)."""

    def __init__(self, kind):
        super().__init__()
        self.kind = kind

    def forward(self, x):
        if self.kind == "gelu":
            return nn.functional.gelu(x, approximate="tanh")
        return nn.functional.softplus(x, beta=20)


@contextlib.contextmanager
def activation(kind):
    """torch_mlp.resnet with `kind` wherever it has ReLU: the modules it builds (nn.ReLU) and
    the one its blocks call after the add (torch.relu). "relu" changes nothing."""
    if kind == "relu":
        yield
        return
    relu, module = torch.relu, nn.ReLU
    torch.relu, nn.ReLU = Smooth(kind), (lambda: Smooth(kind))
    try:
        yield
    finally:
        torch.relu, nn.ReLU = relu, module


def step_check(args, data, states, act):
    """Per step k = 2..K, from dtrain's state after step k - 1: dtrain's loss, gradient (from its
    momentum buffers: m_k - 0.9 m_(k-1) - decay x p_(k-1)) and running statistics after step k,
    against PyTorch's in float64; PyTorch's own float32 step beside it, for the size of float32
    rounding; and dtrain's update against p_(k-1) - lr_k m_k."""
    model, _ = build(args)
    pairs, _ = dtrain_checkpoint.resnet_tensors(model)
    decay = np.concatenate([np.full(t.numel(), WEIGHT_DECAY if args.decay_bn_and_bias or
                                    t.dim() >= 2 else 0.0) for t, _ in pairs])
    steps = data[0].shape[0] // BATCH
    rows = []
    for k in range(2, len(states)):
        prev, cur = states[k - 1], states[k]
        m0, m1, p0, p1 = (np.asarray(a, dtype=np.float64)
                          for a in (prev["m"], cur["m"], prev["params"], cur["params"]))
        grad = m1 - MOMENTUM * m0 - decay * p0
        stats = cur["partial"][k - 1]  # [loss sum, correct, ..., rows] of step k
        loss = stats[0] / stats[4]
        with activation(act):
            ref_loss, ref_grad, ref_bn = torch_step(args, prev, k, data, torch.float64)
            t_loss, t_grad, t_bn = torch_step(args, prev, k, data, torch.float32)
        lr = np.float32(lr_at(args, (k - 1) / steps))
        expected = (p0.astype(np.float32) - lr * m1.astype(np.float32)).astype(np.float64)
        rows.append(dict(
            step=k, lr=float(lr), loss=loss, ref_loss=ref_loss, torch_loss=t_loss,
            loss_err=abs(loss - ref_loss) / ref_loss,
            torch_loss_err=abs(t_loss - ref_loss) / ref_loss,
            grad_err=rel(grad, ref_grad), torch_grad_err=rel(t_grad, ref_grad),
            bn_err=rel(np.asarray(cur["bn"], dtype=np.float64), ref_bn),
            torch_bn_err=rel(t_bn, ref_bn),
            update_err=float(np.abs(p1 - expected).max() / max(np.abs(p1 - p0).max(), 1e-300))))
    return rows


def step_check_passes(rows, grad_factor):
    """dtrain's steps are as exact as PyTorch's float32 steps: over the steps checked, its
    largest distance from float64 in the loss and the running statistics is within 3x
    PyTorch's largest (or 1e-6, a few float32 roundings), in the gradient within grad_factor x,
    and every update is p - lr m to within float32 rounding. The largest, not step by step: with
    ReLU, how far float32 lands from float64 jumps from step to step in either program (1e-5 at
    one step, 1e-3 at the next, where a ReLU's input near 0 falls on the other side)."""
    def near(key, factor=3):
        worst = max(r["torch_" + key] for r in rows)
        return max(r[key] for r in rows) <= factor * max(worst, 1e-6)
    return (near("loss_err") and near("grad_err", grad_factor) and near("bn_err") and
            all(r["update_err"] <= 1e-5 for r in rows))


def smooth_rounding(args, state, k, data):
    """PyTorch's float32 gradient of step k against float64's with every ReLU made smooth
    (softplus): how much of float32's distance comes from ReLUs whose input lies near 0."""
    with activation("softplus"):
        ref = torch_step(args, state, k, data, torch.float64)[1]
        return rel(torch_step(args, state, k, data, torch.float32)[1], ref)


def torch_run(args, data, ckpt=None, dtype=torch.float32):
    """PyTorch's training in dtrain's order, from the step of dtrain's state `ckpt` on or from
    PyTorch's own initial weights. Returns the test loss and accuracy after each epoch."""
    xtr, ytr, xte, yte = data
    model, opt = build(args, ckpt, dtype)
    done = ckpt["global_step"] if ckpt is not None else 0
    loss_fn = nn.CrossEntropyLoss(label_smoothing=args.label_smoothing)
    steps = xtr.shape[0] // BATCH  # the last partial batch dropped, as dtrain does
    epochs = []
    for epoch in range(args.epochs):
        for s in range(steps):
            if epoch * steps + s < done:
                continue
            for g in opt.param_groups:
                g["lr"] = lr_at(args, epoch + s / steps)
            opt.zero_grad(set_to_none=True)
            xb, yb = xtr[s * BATCH:(s + 1) * BATCH].to(dtype), ytr[s * BATCH:(s + 1) * BATCH]
            loss_fn(model(xb), yb).backward()
            opt.step()
        test_loss, test_acc = evaluate(model, xte.to(dtype), yte)
        epochs.append(dict(epoch=epoch + 1, test_loss=test_loss, test_acc=test_acc))
    return epochs


# Each check: the activation of both programs, the gradient's tolerance and what it shows.
CHECKS = {
    "gelu": dict(grad_factor=3, title="Steps with GELU: the strict check", text=(
        "model.activation: gelu in dtrain, GELU (tanh approximation) in place of every ReLU in "
        "PyTorch: a smooth network, where rounding cannot send a gradient down another branch, "
        "so float32's distance from float64 is rounding alone.")),
    "relu": dict(grad_factor=10, title="Steps with ReLU: the config as it is", text=(
        "The config's ReLUs. How far float32 lands from float64 jumps from step to step in "
        "either program, where a ReLU's input lies near 0 and the two precisions pass its kink "
        "on different sides; the gradient is held to 10x PyTorch's largest distance, the "
        "losses, running statistics and updates to the strict check's bounds.")),
}


def step_table(rows, check, smooth):
    lines = [f"## {check['title']}", "", check["text"], "",
             "| step | lr | loss (float64) | loss: dtrain | PyTorch fp32 | gradient: dtrain "
             "| PyTorch fp32 | running stats: dtrain | PyTorch fp32 | dtrain's update |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(
            f"| {r['step']} | {r['lr']:.4g} | {r['ref_loss']:.6f} | {r['loss_err']:.1e} | "
            f"{r['torch_loss_err']:.1e} | {r['grad_err']:.1e} | {r['torch_grad_err']:.1e} | "
            f"{r['bn_err']:.1e} | {r['torch_bn_err']:.1e} | {r['update_err']:.1e} |")
    g, tg = [r["grad_err"] for r in rows], [r["torch_grad_err"] for r in rows]
    ok = step_check_passes(rows, check["grad_factor"])
    lines += ["", f"dtrain's gradients lie {min(g):.1e} to {max(g):.1e} from float64's, "
              f"PyTorch's float32 gradients {min(tg):.1e} to {max(tg):.1e}: "
              + ("**within the bounds.**" if ok else "**outside the bounds.**")]
    if smooth:
        lines[-1] += (f" With every ReLU made smooth (softplus, beta 20), PyTorch's float32 "
                      f"gradient at step {smooth['step']} lies {smooth['smooth']:.1e} from "
                      f"float64's instead of {smooth['relu']:.1e}.")
    return lines + [""], ok


def render(meta, steps, smooth, epochs, path):
    lines = [
        "# dtrain's ResNet against PyTorch's from the same states",
        "",
        f"{meta['date']}, commit {meta['commit']}, {meta['cpu']}, {meta['threads']} threads for "
        f"each program, PyTorch {meta['torch']}. configs/fmnist-resnet.yaml (ResNet-20, widths "
        f"16/32/64, {meta['params']:,} parameters) on the first {meta['train']:,} Fashion-MNIST "
        f"training images, scored on the first {meta['test']:,} test images; batch 128, "
        f"{meta['steps_per_epoch']} steps per epoch; SGD with momentum 0.9, lr 0.1, weight decay "
        f"5e-4 ({meta['decay']}), label smoothing {meta['label_smoothing']}, 1 warmup epoch then "
        "cosine; data.shuffle none and flips and crops off: every epoch visits the images in "
        "order, in both programs. How the check works: scripts/bench/resnet_same_start.py.",
        "",
        "In each step table: from dtrain's state after step k - 1 (its checkpoint), step k as "
        "dtrain took it and as PyTorch takes it in float32, each against PyTorch's step in "
        "float64 from the same state: relative differences (2-norm) of the training loss, the "
        "gradient of every parameter and BatchNorm's running statistics after the step; and "
        "dtrain's update against p - lr m (largest difference over the largest change of a "
        "weight). Bounds: losses and running statistics within 3x PyTorch's largest distance "
        "(or 1e-6), updates within 1e-5.",
        "",
    ]
    ok = True
    for act in ("gelu", "relu"):
        table, passed = step_table(steps[act], CHECKS[act], smooth if act == "relu" else None)
        lines += table
        ok = ok and passed
    lines += [
        ("**The same computation:** convolutions, BatchNorm in training (batch statistics; "
         "running statistics with momentum 0.1 and the unbiased variance), ReLU and GELU, the "
         "residual adds, pooling, the loss, the weight decay, SGD with momentum and the "
         "schedule compute in dtrain as in PyTorch, to float32 rounding."
         if ok else "**Not the same computation: a step lies outside the bounds.**"),
        "",
        "## Epochs (ReLU)",
        "",
        "From dtrain's state after step 1, PyTorch trains the remaining steps on the same "
        "batches in float32 and in float64; from its own initial weights in float32, for "
        "scale. Test loss in nats (plain cross-entropy, BatchNorm's running statistics) and "
        "accuracy in percent after each epoch.",
        "",
        "| epoch | dtrain loss | PyTorch fp32 | PyTorch fp64 | PyTorch own init "
        "| dtrain acc | PyTorch fp32 | PyTorch fp64 | PyTorch own init |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in epochs:
        lines.append(
            f"| {r['epoch']} | {r['dtrain_loss']:.4f} | {r['fp32_loss']:.4f} | "
            f"{r['fp64_loss']:.4f} | {r['own_loss']:.4f} | {100 * r['dtrain_acc']:.2f} | "
            f"{100 * r['fp32_acc']:.2f} | {100 * r['fp64_acc']:.2f} | {100 * r['own_acc']:.2f} |")
    lines += [
        "",
        "The two programs' float32 trajectories and PyTorch's float64 one start from the same "
        "state and see the same batches; what separates them is rounding, which training "
        "amplifies step by step. The step tables, not this one, test sameness.",
        "",
        f"Reproduce: `{('scripts/bench-resnet-same-start.sh ' + meta['argv']).strip()}`",
        "",
    ]
    with open(path, "w") as f:
        f.write("\n".join(lines))
    return ok


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--dtrain", default=os.path.join(ROOT, "build", "apps", "dtrain"))
    p.add_argument("--out", default=os.path.join(ROOT, "results", "bench"))
    p.add_argument("--stem", default="resnet-same-start")
    p.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--steps", type=int, default=8, help="steps checked one by one")
    p.add_argument("--train-limit", type=int, default=6016)
    p.add_argument("--test-limit", type=int, default=2000)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--label-smoothing", type=float, default=0.0)
    p.add_argument("--no-decay-bn-and-bias", dest="decay_bn_and_bias", action="store_false",
                   help="weight decay on weights only (optimizer.decay_bn_and_bias: false)")
    p.add_argument("--dtrain-set", action="append", default=[], metavar="KEY=VALUE",
                   help="an override for dtrain alone, after the check's own (a deliberate "
                        "mismatch, to see the check fail)")
    args = p.parse_args()
    if args.steps < 2 or args.train_limit < (args.steps + 1) * BATCH:
        p.error("--steps must be 2 at least, and --train-limit must hold --steps + 1 batches")
    argv = " ".join(sys.argv[1:])
    torch.set_num_threads(args.threads)
    data = load_data(args)
    work = tempfile.mkdtemp(prefix="resnet-same-start-")
    try:
        subprocess.run(dtrain_cmd(args, work, "full"), check=True, stdout=subprocess.DEVNULL)
        d = dtrain_epochs(work, "full")
        states = {act: [None] + [dtrain_checkpoint_after(args, work, k, act)
                                 for k in range(1, args.steps + 1)] for act in CHECKS}
    finally:
        shutil.rmtree(work, ignore_errors=True)
    steps = {act: step_check(args, data, states[act], act) for act in CHECKS}
    worst = max(steps["relu"], key=lambda r: r["torch_grad_err"])
    smooth = dict(step=worst["step"], relu=worst["torch_grad_err"],
                  smooth=smooth_rounding(args, states["relu"][worst["step"] - 1], worst["step"],
                                         data))
    relu = states["relu"][1]
    runs = [torch_run(args, data, relu), torch_run(args, data, relu, torch.float64),
            torch_run(args, data)]
    epochs = [dict(epoch=de["epoch"], dtrain_loss=de["test_loss"], dtrain_acc=de["test_acc"],
                   fp32_loss=a["test_loss"], fp32_acc=a["test_acc"], fp64_loss=b["test_loss"],
                   fp64_acc=b["test_acc"], own_loss=c["test_loss"], own_acc=c["test_acc"])
              for de, a, b, c in zip(d, *runs)]
    sha = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short=12", "HEAD"],
                         capture_output=True, text=True).stdout.strip()
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo")
                if l.startswith("model name")), platform.machine())
    meta = dict(date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), commit=sha, cpu=cpu,
                threads=args.threads, torch=torch.__version__,
                params=sum(t.numel() for t in torch_mlp.resnet(RESNET).parameters()),
                train=args.train_limit, test=args.test_limit,
                steps_per_epoch=args.train_limit // BATCH, label_smoothing=args.label_smoothing,
                decay="on every parameter" if args.decay_bn_and_bias else
                "on weights only, not on BatchNorm or biases", argv=argv)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, args.stem + ".json"), "w") as f:
        json.dump(dict(meta=meta, steps=steps, smooth=smooth, epochs=epochs), f, indent=2)
    ok = render(meta, steps, smooth, epochs, os.path.join(args.out, args.stem + ".md"))
    print(open(os.path.join(args.out, args.stem + ".md")).read())
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
