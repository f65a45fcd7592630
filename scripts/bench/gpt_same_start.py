#!/usr/bin/env python3
"""Is dtrain's GPT training the same computation as PyTorch's? A loss check from a shared start.

Two programs seeded alike still start from different random weights and visit the data in
different orders, so their losses differ by seed noise, which at a few hundred steps can exceed
the difference one is looking for. This check removes both sources: dtrain trains the GPT with
data.shuffle none (every epoch visits the windows in order) and saves a checkpoint after its
first step; PyTorch (torch_gpt.py --order sequential --start-from) loads that checkpoint (the
weights, Adam's moments, the step count) and trains the remaining steps on the same batches with
the same recipe. What is left between the two programs' losses is arithmetic: the order of
floating-point sums in GEMMs and reductions, and chaos amplifying it over the steps.

For scale, PyTorch also trains once from its own initial weights (same order, same recipe): the
difference a change of initial weights alone makes.

The dtrain checkpoint after step 1 comes from a second dtrain run that the test fault hook
(DTRAIN_FAULT=0:2, the tests' way to make rank 0 fail at step 2) stops after step 1, with a
checkpoint every step (train.checkpoint_steps=1): a failed run keeps its last checkpoint.

Usage: gpt_same_start.py --dtrain build/apps/dtrain --out results/bench [--epochs 3]
       [--n-layer 4 --n-head 4 --n-embd 256 --block 128 --batch 32 --threads 2]
"""
import argparse
import csv
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
CONFIG = os.path.join(ROOT, "configs", "bytes-gpt.yaml")
SAME_NATS = 1e-3  # same start, same batches: a larger difference is a difference in the math


def dtrain_cmd(args, results, tag, extra=()):
    return [args.dtrain, "run", CONFIG, "backend=cpu", "gpus=1", f"threads={args.threads}",
            f"data.path={args.data}", "data.exclude=[]", "data.sha256=''", "data.shuffle=none",
            f"data.block_size={args.block}",
            f"data.train_limit={args.train_limit}", f"model.n_layer={args.n_layer}",
            f"model.n_head={args.n_head}", f"model.n_embd={args.n_embd}",
            f"train.per_replica_batch={args.batch}", f"optimizer.base_batch={args.batch}",
            f"train.epochs={args.epochs}", f"train.seed={args.seed}", *extra,
            "--results", results, "--tag", tag, "--quiet"]


def dtrain_epochs(results, tag):
    with open(os.path.join(results, "bytes-gpt", f"{tag}-g1", "metrics.csv")) as f:
        return [dict(epoch=int(r["epoch"]), train_loss=float(r["train_loss"]),
                     test_loss=float(r["test_loss"])) for r in csv.DictReader(f)]


def dtrain_step1_checkpoint(args, results):
    """A checkpoint after step 1: the run fails at step 2 by the fault hook, keeping it."""
    env = dict(os.environ, DTRAIN_FAULT="0:2")
    cmd = dtrain_cmd(args, results, "step1", ["train.checkpoint_steps=1"])
    p = subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    path = os.path.join(results, "bytes-gpt", "step1-g1", "checkpoint.bin")
    if p.returncode == 0 or not os.path.exists(path):
        raise SystemExit(f"no checkpoint after step 1 (dtrain exit {p.returncode}):\n"
                         f"{p.stderr[-2000:]}")
    return path


def torch_run(args, start_from=None):
    cmd = [sys.executable, os.path.join(HERE, "torch_gpt.py"), f"--data={args.data}",
           f"--block={args.block}", f"--train-limit={args.train_limit}",
           f"--n-layer={args.n_layer}", f"--n-head={args.n_head}", f"--n-embd={args.n_embd}",
           f"--batch={args.batch}", f"--epochs={args.epochs}", f"--threads={args.threads}",
           f"--seed={args.seed}", "--order=sequential",
           *([f"--start-from={start_from}"] if start_from else [])]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit(f"torch_gpt.py failed:\n{p.stderr[-3000:]}")
    line = next(l for l in p.stdout.splitlines() if l.startswith("SUMMARY "))
    return json.loads(line[len("SUMMARY "):])


def render(meta, rows, path):
    worst = max(abs(r["same_start_delta"]) for r in rows)
    own = max(abs(r["own_init_delta"]) for r in rows)
    lines = [
        "# dtrain's GPT against PyTorch's from the same start",
        "",
        f"{meta['date']}, commit {meta['commit']}, {meta['cpu']}, {meta['threads']} threads for "
        f"each program, PyTorch {meta['torch']}. Model: {meta['n_layer']} layers, "
        f"{meta['n_head']} heads, width {meta['n_embd']}, context {meta['block']}, vocabulary "
        f"256 (bytes), batch {meta['batch']}, {meta['steps_per_epoch']} steps per epoch, "
        f"{meta['epochs']} epochs; configs/bytes-gpt.yaml's recipe (AdamW, 0.5 warmup epochs "
        "then cosine, gradient clip 1.0) with data.shuffle none: every epoch visits the "
        f"training windows of `{meta['data']}` in order, in both programs.",
        "",
        "dtrain trains from its seed. PyTorch (scripts/bench/torch_gpt.py, nanoGPT's layout) "
        "loads dtrain's checkpoint after step 1 (weights, Adam moments, step count; "
        "scripts/bench/dtrain_checkpoint.py) and trains the remaining steps on the same "
        "batches: **same start**. For scale, PyTorch also trains from its own initial weights "
        "(same order): **own init**. Losses in nats per byte; validation: the mean over every "
        "position of every validation window, after each epoch.",
        "",
        "| epoch | dtrain val loss | PyTorch, same start | difference | PyTorch, own init "
        "| difference | dtrain train loss | PyTorch train loss, same start |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(f"| {r['epoch']} | {r['dtrain_val']:.5f} | {r['same_start_val']:.5f} | "
                     f"{r['same_start_delta']:+.5f} | {r['own_init_val']:.5f} | "
                     f"{r['own_init_delta']:+.5f} | {r['dtrain_train']:.5f} | "
                     f"{r['same_start_train']:.5f} |")
    lines += [
        "",
        (f"From the same start the two programs' validation losses stay within {worst:.1e} "
         f"nats over {meta['steps_per_epoch'] * meta['epochs']} steps, against up to "
         f"{own:.3f} nats that PyTorch's own initial weights alone make. "
         + ("Within the check's tolerance (1e-3 nats): the forward pass, the backward pass, "
            "clipping, AdamW, the learning-rate schedule and the validation loss compute the "
            "same in both programs, and a difference between independently seeded runs of the "
            "two (results/bench/gpt-vs-pytorch-loss.md) is seed noise unless enough seeds "
            "resolve it."
            if worst <= SAME_NATS else
            "**Outside the check's tolerance (1e-3 nats): the programs compute differently.**")
         + " (PyTorch's epoch-1 train loss omits step 1, which the checkpoint holds.)"),
        "",
        f"Reproduce: `{('scripts/bench-gpt-same-start.sh ' + meta['argv']).strip()}`",
        "",
    ]
    with open(path, "w") as f:
        f.write("\n".join(lines))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--dtrain", default=os.path.join(ROOT, "build", "apps", "dtrain"))
    p.add_argument("--out", default=os.path.join(ROOT, "results", "bench"))
    p.add_argument("--stem", default="gpt-same-start")
    p.add_argument("--data", default="/usr/share/common-licenses")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--train-limit", type=int, default=0)
    p.add_argument("--n-layer", type=int, default=4)
    p.add_argument("--n-head", type=int, default=4)
    p.add_argument("--n-embd", type=int, default=256)
    p.add_argument("--block", type=int, default=128)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args()
    argv = " ".join(sys.argv[1:])
    work = tempfile.mkdtemp(prefix="gpt-same-start-")
    try:
        subprocess.run(dtrain_cmd(args, work, "full"), check=True, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
        d = dtrain_epochs(work, "full")
        same = torch_run(args, dtrain_step1_checkpoint(args, work))
        own = torch_run(args)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    rows = []
    for de, se, oe in zip(d, same["epochs"], own["epochs"]):
        rows.append(dict(epoch=de["epoch"], dtrain_val=de["test_loss"],
                         same_start_val=se["test_loss"], own_init_val=oe["test_loss"],
                         same_start_delta=de["test_loss"] - se["test_loss"],
                         own_init_delta=de["test_loss"] - oe["test_loss"],
                         dtrain_train=de["train_loss"], same_start_train=se["train_loss"]))
    sha = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short=12", "HEAD"],
                         capture_output=True, text=True).stdout.strip()
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo")
                if l.startswith("model name")), platform.machine())
    meta = dict(date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), commit=sha, cpu=cpu,
                threads=args.threads, torch=same["torch"], n_layer=args.n_layer,
                n_head=args.n_head, n_embd=args.n_embd, block=args.block, batch=args.batch,
                epochs=args.epochs, steps_per_epoch=same["steps_per_epoch"], data=args.data,
                argv=argv)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, args.stem + ".json"), "w") as f:
        json.dump(dict(meta=meta, rows=rows), f, indent=2)
    render(meta, rows, os.path.join(args.out, args.stem + ".md"))
    print(open(os.path.join(args.out, args.stem + ".md")).read())
    return 0 if max(abs(r["same_start_delta"]) for r in rows) <= SAME_NATS else 1


if __name__ == "__main__":
    sys.exit(main())
