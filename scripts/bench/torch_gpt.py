#!/usr/bin/env python3
"""PyTorch peer for dtrain's GPT benchmark: nanoGPT's GPT-2 layout (model.py) on bytes, with
the data pipeline and recipe of dtrain's `data.dataset: bytes` + `model.type: gpt`.

  python3 torch_gpt.py --epochs 3 --threads 2                    # eager
  python3 torch_gpt.py --epochs 3 --threads 2 --mode compile     # torch.compile (Inductor, C++)
  python3 torch_gpt.py --device cuda --precision bf16 --mode compile   # on one GPU
  python3 torch_gpt.py --order sequential --start-from RUN/checkpoint.bin   # continue a dtrain run

The model: token and position embeddings; n_layer pre-LayerNorm blocks, each
x + attention(LN(x)) then x + MLP(LN(x)); the attention one dense C -> 3C (queries, keys, values,
with bias), causal scaled dot-product attention over n_head heads (PyTorch's fused SDPA kernel,
as nanoGPT uses it), one dense C -> C (with bias); the MLP C -> 4C, GELU (tanh approximation),
4C -> C; a final LayerNorm; the output head shares the token embedding's matrix and has no bias.
LayerNorms have a bias and eps 1e-5. Weights start N(0, 0.02), the last dense layer of each
branch N(0, 0.02 / sqrt(2 n_layer)), biases 0, LayerNorm scale 1.

The data, as dtrain reads them: a file, or a folder's regular files (sub-folders included,
hidden entries skipped, links to files read) sorted by path, as one stream of bytes; the last
floor(validation x total) bytes are the validation set. A sample is a window of block + 1 bytes,
the windows of a part starting every block bytes ((bytes - 1) // block of them; --train-limit
keeps the first N training windows, dtrain's data.train_limit). Each epoch visits the training
windows in a fresh random order and drops the last partial batch. The loss is the mean
cross-entropy over all block next-byte predictions of the batch (nats per byte).

The recipe, as dtrain runs configs/bytes-gpt.yaml: AdamW (betas 0.9/0.95, eps 1e-8, weight decay
0.1 on the 2-D weights only: embeddings and dense weights, not biases or LayerNorms), the
gradient clipped to a global norm of 1.0, the learning rate per step at epoch position
epoch + step/steps by dtrain's rule (lib/dtrain/nn/schedule.cpp: during the warmup epochs a ramp
from the base to the scaled peak, which at the base batch (the benchmarks run the batch they give
as optimizer.base_batch) is flat; then a cosine from the peak
to --min-lr over the remaining epochs).

On a GPU (--device cuda) the windows live on the device and are gathered there; --precision
fp32 keeps TF32 off in GEMMs (tf32 allows it), bf16 runs the forward under autocast to bfloat16
(weights, gradients and AdamW in FP32, as dtrain's precision: bf16); modes eager, compile and
compile-max (torch.compile mode="max-autotune", Triton GEMM autotuning and CUDA graphs).

Timing: one forward and backward pass on a training batch (its gradient thrown away, no update,
so training is unchanged) runs before the first epoch and is reported as warmup_s; in compile
mode it is where torch.compile compiles (the forward and backward graphs). Each epoch's time is
training only; the validation loss (the mean over every position of every validation window) is
computed after it, untimed, by the eager module (the same parameters). The first epoch is
reported apart from the steady-state median of the later ones.

--start-from continues a 1-replica dtrain run of the same model and recipe from its checkpoint
(dtrain_checkpoint.py: the weights, Adam's moments and step count), skipping the steps it holds;
with --order sequential (dtrain's data.shuffle none) both programs then see the same batches, so
what remains between them is arithmetic (scripts/bench/gpt_same_start.py).

Prints one JSON line per epoch and a final JSON summary line (prefixed "SUMMARY ").
"""
import argparse
import contextlib
import json
import math
import os
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


# ---- data: dtrain's data.dataset bytes ----

def corpus_files(path):
    """The files dtrain reads for `path`, in its order (lib/dtrain/data/text.cpp)."""
    if os.path.isfile(path):
        return [path]
    if not os.path.isdir(path):
        raise SystemExit(f"{path}: neither a file nor a folder")
    files = []
    for d, dirs, names in os.walk(path):  # links to folders are not followed
        dirs[:] = [x for x in dirs if not x.startswith(".")]
        for n in names:
            p = os.path.join(d, n)
            if not n.startswith(".") and os.path.isfile(p):
                files.append(p)
    return sorted(files, key=lambda s: s.encode())  # byte order, as std::sort on strings


def windows(data, block, limit=0):
    count = (len(data) - 1) // block if len(data) > block else 0
    if limit > 0:
        count = min(count, limit)
    t = torch.frombuffer(bytearray(data), dtype=torch.uint8).to(torch.int64)
    idx = torch.arange(count).unsqueeze(1) * block + torch.arange(block + 1).unsqueeze(0)
    return t[idx]  # [count, block + 1]


def load(args):
    files = corpus_files(args.data)
    data = b"".join(open(f, "rb").read() for f in files)
    test = int(math.floor(len(data) * args.validation))
    train_bytes, test_bytes = data[:len(data) - test], data[len(data) - test:]
    return (windows(train_bytes, args.block, args.train_limit), windows(test_bytes, args.block),
            len(files), len(data))


# ---- the model ----

class SelfAttention(nn.Module):
    def __init__(self, c, heads):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(c, 3 * c)
        self.proj = nn.Linear(c, c)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)
        # [b, t, c] -> [b, heads, t, c / heads]
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).contiguous().view(b, t, c))


class Block(nn.Module):
    def __init__(self, c, heads):
        super().__init__()
        self.ln1 = nn.LayerNorm(c, eps=1e-5)
        self.attn = SelfAttention(c, heads)
        self.ln2 = nn.LayerNorm(c, eps=1e-5)
        self.fc = nn.Linear(c, 4 * c)
        self.act = nn.GELU(approximate="tanh")
        self.proj = nn.Linear(4 * c, c)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.proj(self.act(self.fc(self.ln2(x))))


class GPT(nn.Module):
    def __init__(self, vocab, block, layers, heads, c):
        super().__init__()
        self.tok = nn.Embedding(vocab, c)
        self.pos = nn.Embedding(block, c)
        self.blocks = nn.ModuleList(Block(c, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(c, eps=1e-5)
        self.head = nn.Linear(c, vocab, bias=False)
        self.head.weight = self.tok.weight  # tied
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, 0.0, 0.02)
                if getattr(m, "bias", None) is not None:
                    nn.init.zeros_(m.bias)
        for b in self.blocks:  # each branch's last projection
            for m in (b.attn.proj, b.proj):
                nn.init.normal_(m.weight, 0.0, 0.02 / math.sqrt(2 * layers))
        self.register_buffer("positions", torch.arange(block), persistent=False)

    def forward(self, ids, targets):
        x = self.tok(ids) + self.pos(self.positions[:ids.shape[1]])
        for b in self.blocks:
            x = b(x)
        logits = self.head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.reshape(-1))


# ---- the recipe ----

def lr_at(args, epoch_pos):
    """dtrain's lr_at at the base batch (peak = base lr): flat during the warmup, then the
    cosine from the peak to min_lr."""
    peak, w = args.lr, args.warmup
    if w > 0 and epoch_pos < w:
        return args.lr + (peak - args.lr) * epoch_pos / w
    frac = min(1.0, max(0.0, (epoch_pos - w) / max(1e-12, args.epochs - w)))
    floor_lr = min(args.min_lr, peak)
    return floor_lr + (peak - floor_lr) * 0.5 * (1 + math.cos(math.pi * frac))


def make_optimizer(model, args):
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": args.weight_decay},
              {"params": rest, "weight_decay": 0.0}]
    kw = dict(lr=args.lr, betas=(args.beta1, args.beta2), eps=args.eps)
    if args.optimizer_impl == "fused":
        try:  # the fused CPU kernel (PyTorch >= 2.4), the fastest of its AdamW implementations
            return torch.optim.AdamW(groups, fused=True, **kw), "fused"
        except (RuntimeError, TypeError) as e:
            print(f"# fused AdamW unavailable ({e}); using for-each", file=sys.stderr)
    return torch.optim.AdamW(groups, foreach=True, **kw), "foreach"


def autocast(args):
    if args.precision != "bf16":
        return contextlib.nullcontext()
    return torch.autocast(torch.device(args.device).type, dtype=torch.bfloat16)


def sync(args):
    if torch.device(args.device).type == "cuda":
        torch.cuda.synchronize()


@torch.no_grad()
def validation_loss(model, test, args, chunk=64):
    """The mean over every position of every validation window (all windows have block
    positions, so the mean of per-chunk means weighted by windows)."""
    model.eval()
    total = 0.0
    for i in range(0, test.shape[0], chunk):
        w = test[i:i + chunk]
        with autocast(args):
            total += model(w[:, :-1], w[:, 1:]).item() * w.shape[0]
    model.train()
    return total / test.shape[0]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--data", default="/usr/share/common-licenses")
    p.add_argument("--validation", type=float, default=0.1)
    p.add_argument("--block", type=int, default=128)
    p.add_argument("--train-limit", type=int, default=0, help="first N training windows (0: all)")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--n-layer", type=int, default=4)
    p.add_argument("--n-head", type=int, default=4)
    p.add_argument("--n-embd", type=int, default=256)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--min-lr", type=float, default=0.0)
    p.add_argument("--warmup", type=float, default=0.5, help="warmup epochs")
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--beta1", type=float, default=0.9)
    p.add_argument("--beta2", type=float, default=0.95)
    p.add_argument("--eps", type=float, default=1e-8)
    p.add_argument("--grad-clip", type=float, default=1.0)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--mode", choices=["eager", "compile", "compile-max"], default="eager")
    p.add_argument("--device", default="cpu", help="cpu or cuda (one GPU)")
    p.add_argument("--precision", choices=["fp32", "tf32", "bf16"], default="fp32")
    p.add_argument("--optimizer-impl", choices=["fused", "foreach"], default="fused")
    p.add_argument("--order", choices=["shuffled", "sequential"], default="shuffled",
                   help="sequential: every epoch visits the windows in order (data.shuffle none)")
    p.add_argument("--start-from", metavar="CHECKPOINT",
                   help="continue a 1-replica dtrain run of this model from its checkpoint.bin: "
                        "its weights, Adam moments and step count (needs --order sequential)")
    args = p.parse_args()
    if args.start_from and args.order != "sequential":
        p.error("--start-from needs --order sequential (dtrain's shuffled order is its own)")
    if args.start_from and args.device != "cpu":
        p.error("--start-from runs on the CPU (--device cpu)")

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    dev = torch.device(args.device)
    if dev.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = args.precision == "tf32"
        torch.backends.cudnn.allow_tf32 = args.precision == "tf32"
    train, test, nfiles, nbytes = load(args)
    train, test = train.to(dev), test.to(dev)  # on a GPU, gathered there
    model = GPT(256, args.block, args.n_layer, args.n_head, args.n_embd).to(dev)
    params = sum(p.numel() for p in model.parameters())
    opt, opt_impl = make_optimizer(model, args)
    done = 0  # optimizer steps already taken (in the checkpoint)
    if args.start_from:
        import dtrain_checkpoint
        ckpt = dtrain_checkpoint.read_checkpoint(args.start_from)
        dtrain_checkpoint.load_gpt(model, opt, ckpt)
        done = ckpt["global_step"]
    step_model = model
    compile_error = None
    if args.mode.startswith("compile"):
        step_model = torch.compile(model,
                                   mode="max-autotune" if args.mode == "compile-max" else None)
    steps = train.shape[0] // args.batch  # the last partial batch dropped
    gen = torch.Generator().manual_seed(args.seed)

    # Warm-up (compilation in compile mode): forward and backward, the gradient discarded.
    t0 = time.perf_counter()
    try:
        w = train[:args.batch]
        with autocast(args):
            loss = step_model(w[:, :-1], w[:, 1:])
        loss.backward()
        sync(args)
    except Exception as e:  # a compiler missing on this machine, say: record why, run eager
        compile_error = f"{type(e).__name__}: {str(e).strip().splitlines()[0][:300]}"
        print(f"# torch.compile failed ({compile_error}); running eager", file=sys.stderr)
        step_model = model
        opt.zero_grad(set_to_none=True)
        w = train[:args.batch]
        with autocast(args):
            loss = model(w[:, :-1], w[:, 1:])
        loss.backward()
    opt.zero_grad(set_to_none=True)
    warmup_s = time.perf_counter() - t0
    print(json.dumps({"warmup_s": warmup_s, "mode": args.mode, "params": params,
                      "train_windows": int(train.shape[0]), "test_windows": int(test.shape[0]),
                      "steps_per_epoch": steps, "corpus_files": nfiles,
                      "corpus_bytes": nbytes}), flush=True)

    times, rows = [], []
    tokens_per_epoch = steps * args.batch * args.block
    for epoch in range(args.epochs):
        perm = (torch.randperm(train.shape[0], generator=gen) if args.order == "shuffled"
                else torch.arange(train.shape[0])).to(dev)
        model.train()
        sync(args)
        t0 = time.perf_counter()
        loss_sum = torch.zeros((), device=dev)
        first = min(steps, max(0, done - epoch * steps))  # steps the checkpoint took
        for s in range(first, steps):
            lr = lr_at(args, epoch + s / steps)
            for g in opt.param_groups:
                g["lr"] = lr
            xb = train[perm[s * args.batch:(s + 1) * args.batch]]
            with autocast(args):
                loss = step_model(xb[:, :-1], xb[:, 1:])
            loss.backward()
            if args.grad_clip > 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip)
            opt.step()
            opt.zero_grad(set_to_none=True)
            loss_sum += loss.detach()
        sync(args)
        dt = time.perf_counter() - t0
        times.append(dt)
        val = validation_loss(model, test, args)
        row = {"epoch": epoch + 1, "epoch_time_s": dt, "tokens_per_s": tokens_per_epoch / dt,
               "train_loss": (loss_sum / max(1, steps - first)).item(), "test_loss": val,
               "first_step": first}
        rows.append(row)
        print(json.dumps(row), flush=True)
    steady = statistics.median(times[1:]) if len(times) > 1 else times[0]
    print("SUMMARY " + json.dumps({
        "framework": "pytorch", "mode": args.mode if compile_error is None else "eager",
        "mode_asked": args.mode, "compile_error": compile_error, "torch": torch.__version__,
        "threads": args.threads, "device": args.device, "precision": args.precision,
        "optimizer_impl": opt_impl, "params": params,
        "batch": args.batch, "block": args.block, "steps_per_epoch": steps,
        "tokens_per_epoch": tokens_per_epoch, "warmup_s": warmup_s,
        "first_epoch_time_s": times[0], "steady_epoch_time_s": steady,
        "first_tokens_per_s": tokens_per_epoch / times[0],
        "steady_tokens_per_s": tokens_per_epoch / steady,
        "final_train_loss": rows[-1]["train_loss"], "final_test_loss": rows[-1]["test_loss"],
        "epochs": rows}), flush=True)


if __name__ == "__main__":
    sys.exit(main())
