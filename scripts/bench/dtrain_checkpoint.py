"""Reads a dtrain checkpoint (checkpoint.bin in a run folder) into numpy arrays, and maps a
model's flat parameter vector onto PyTorch modules (torch_gpt.py's GPT, torch_mlp.py's ResNet),
so that PyTorch can continue a dtrain run from the same weights and optimizer state.

The file (lib/dtrain/train/checkpoint.{hpp,cpp}), little-endian: the line "dtrain checkpoint 7\n";
the resolved config (u64 length, bytes); replicas, epoch (i32 each); step, global step (i64 each);
params, the optimizer's first moments (SGD: the momentum buffers) and second moments (Adam
only), BatchNorm state (u64 count, f32 each); the random streams (u64 count, u64 each); the
noise-scale averages (4 f64); per finished step of the epoch in progress [loss sum, correct,
local norm^2, reduced norm^2, rows] (u64 count, f64 each); the epoch's first LR (f64); its
phase times (6 f64); every finished step's loss (u64 count, f64 each); launches per step (i64);
the finished epochs' metrics; (version 4) the scorings of the test set; (version 5) the data's
fingerprint; a CRC-32 of everything before it.

dtrain's GPT lays its parameters out layer by layer (lib/dtrain/nn/transformer.cpp, gpt_layers):
the token then the position embedding ([rows, C] each); per block the LayerNorm (scale, shift),
the q/k/v dense layer, the attention's output dense layer, the second LayerNorm, the MLP's two
dense layers; the final LayerNorm. A dense layer is its weight as [in, out] (PyTorch's
nn.Linear keeps [out, in]: transposed here) then its bias. The head shares the token embedding.
"""
import struct
import zlib

import numpy as np

MAGIC = b"dtrain checkpoint "  # then the version (1 to 7: they differ only in the epochs' fields,
                               # the test scorings and the data's fingerprint, after everything
                               # read here) and a newline


def read_checkpoint(path):
    b = open(path, "rb").read()
    if not b.startswith(MAGIC) or b[len(MAGIC):len(MAGIC) + 2] not in (
            b"1\n", b"2\n", b"3\n", b"4\n", b"5\n", b"6\n", b"7\n"):
        raise SystemExit(f"{path}: not a dtrain checkpoint of version 1 to 7")
    if struct.unpack_from("<I", b, len(b) - 4)[0] != zlib.crc32(b[:-4]):
        raise SystemExit(f"{path}: its checksum does not match")
    at = len(MAGIC) + 2

    def pod(fmt):
        nonlocal at
        v = struct.unpack_from(fmt, b, at)
        at += struct.calcsize(fmt)
        return v

    def vec(dtype):
        nonlocal at
        (n,) = pod("<Q")
        a = np.frombuffer(b, dtype=dtype, count=n, offset=at)
        at += n * a.itemsize
        return a

    (n,) = pod("<Q")
    at += n  # the config text
    replicas, epoch = pod("<ii")
    step, global_step = pod("<qq")
    params, m, v, bn = (vec("<f4") for _ in range(4))
    vec("<u8")  # random streams
    pod("<4d")  # noise scale
    partial = vec("<f8").reshape(-1, 5)
    pod("<d")
    pod("<6d")
    step_losses = vec("<f8")
    return dict(replicas=replicas, epoch=epoch, step=step, global_step=global_step,
                params=params, m=m, v=v, bn=bn, partial=partial, step_losses=step_losses)


def gpt_tensors(model):
    """torch_gpt.GPT's parameters in dtrain's flat order, each with whether it is transposed."""
    out = [(model.tok.weight, False), (model.pos.weight, False)]
    for b in model.blocks:
        for ln, dense in ((b.ln1, (b.attn.qkv, b.attn.proj)), (b.ln2, (b.fc, b.proj))):
            out += [(ln.weight, False), (ln.bias, False)]
            for d in dense:
                out += [(d.weight, True), (d.bias, False)]
    out += [(model.ln_f.weight, False), (model.ln_f.bias, False)]
    return out


def unflatten(model, flat):
    """Tensors shaped as gpt_tensors(model) from dtrain's flat vector."""
    return unflatten_tensors(gpt_tensors(model), flat)


def load_gpt(model, opt, ckpt):
    """Copies the checkpoint's weights into `model` and its Adam moments and step count into
    `opt` (a torch.optim.AdamW over the model's parameters)."""
    import torch
    if ckpt["replicas"] != 1:
        raise SystemExit("a checkpoint of one replica is needed")
    pairs = gpt_tensors(model)
    with torch.no_grad():
        for (t, _), a in zip(pairs, unflatten(model, ckpt["params"])):
            t.copy_(a)
    step = torch.tensor(float(ckpt["global_step"]), dtype=torch.float32)
    for (t, _), m, v in zip(pairs, unflatten(model, ckpt["m"]), unflatten(model, ckpt["v"])):
        opt.state[t] = {"step": step.clone(), "exp_avg": m, "exp_avg_sq": v}


def resnet_tensors(model):
    """A PyTorch ResNet's parameters in dtrain's flat order, each with whether it is transposed,
    and its BatchNorm layers in order. dtrain lays out a layer list in order, a residual block's
    body before its shortcut (the order torch_mlp.Block registers them); a convolution as
    [out, in, kh, kw] then its bias, as PyTorch does; BatchNorm as scale then shift; a dense
    layer as [in, out] (transposed here) then its bias."""
    import torch.nn as nn
    out, norms = [], []
    for m in model.modules():
        if isinstance(m, nn.Conv2d):
            out += [(m.weight, False)] + ([(m.bias, False)] if m.bias is not None else [])
        elif isinstance(m, nn.BatchNorm2d):
            out += [(m.weight, False), (m.bias, False)]
            norms.append(m)
        elif isinstance(m, nn.Linear):
            out += [(m.weight, True), (m.bias, False)]
    return out, norms


def unflatten_tensors(pairs, flat):
    """Tensors shaped as `pairs` (tensor, transposed) from a flat vector that holds exactly
    them."""
    import torch
    res, at = [], 0
    for t, transposed in pairs:
        n = t.numel()
        if at + n > len(flat):
            raise SystemExit(f"the checkpoint holds {len(flat)} parameters; this model needs more")
        a = torch.from_numpy(np.array(flat[at:at + n], dtype=np.float32))
        a = a.view(*t.shape[::-1]).t() if transposed else a.view(*t.shape)
        res.append(a.contiguous())
        at += n
    if at != len(flat):
        raise SystemExit(f"the checkpoint holds {len(flat)} parameters; this model has {at}")
    return res


def load_resnet(model, opt, ckpt):
    """Copies the checkpoint's weights and BatchNorm running statistics into `model` (built by
    torch_mlp.resnet) and its momentum buffers into `opt` (a torch.optim.SGD over the model's
    parameters)."""
    import torch
    if ckpt["replicas"] != 1:
        raise SystemExit("a checkpoint of one replica is needed")
    pairs, norms = resnet_tensors(model)
    with torch.no_grad():
        for (t, _), a in zip(pairs, unflatten_tensors(pairs, ckpt["params"])):
            t.copy_(a)
        state = np.asarray(ckpt["bn"], dtype=np.float32)
        need = sum(2 * n.num_features for n in norms)
        if len(state) != need:
            raise SystemExit(f"the checkpoint holds {len(state)} BatchNorm statistics; this "
                             f"model has {need}")
        at = 0
        for n in norms:  # [running mean (c), running var (c)] per BatchNorm
            c = n.num_features
            n.running_mean.copy_(torch.from_numpy(state[at:at + c].copy()))
            n.running_var.copy_(torch.from_numpy(state[at + c:at + 2 * c].copy()))
            n.num_batches_tracked.fill_(int(ckpt["global_step"]))
            at += 2 * c
    for (t, _), m in zip(pairs, unflatten_tensors(pairs, ckpt["m"])):
        opt.state[t] = {"momentum_buffer": m}
