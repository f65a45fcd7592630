#!/usr/bin/env python3
"""Where a step's GPU time goes, from an ncu per-kernel summary: the kernels of
`ncu --metrics gpu__time_duration.sum --print-summary per-kernel ...` ranked by their total time
(invocations x average), with each one's share of the profiled window.

ncu serialises kernels and flushes the caches between them, so its times run above those of a
free-running step; the ranking, not the sum, is what it tells.

Usage: ncu_kernel_sums.py NCU_OUTPUT.txt [--top 25] [--steps N] [--families]
  --steps N    also divide the total by N profiled steps (a step's time in kernels)
  --families   also sum the kernels by what they do (FAMILIES below: the matrix work of cuBLAS
               and cuDNN, precision casts, layout transposes, normalisation, ...), the first
               pattern that matches a kernel's name naming its family
"""
import argparse
import re

KERNEL = re.compile(
    r"\n  (\S.*?) \((\d+), (\d+), (\d+)\)x\((\d+), (\d+), (\d+)\), Device \d+, CC [\d.]+, "
    r"Invocations (\d+)\n(.*?)gpu__time_duration\.sum\s+(\w+)\s+([\d.,]+)\s+([\d.,]+)\s+([\d.,]+)",
    re.S)
# What a kernel does, from its name: dtrain's kernels (dtrain::), PyTorch's (at::), and those of
# cuBLAS and cuDNN. First match wins; the order matters ("bfloat16_copy" is a cast, not a copy).
FAMILIES = [
    ("casts fused with transposes", r"k_transposed_cast"),
    ("precision casts", r"k_to_bf16|k_from_bf16|bfloat16_copy_kernel"),
    ("layout transposes", r"nchwToNhwc|nhwcToNchw|nhwcAddPadding|k_transpose"),
    # Attention outside its matrix products: dtrain's head split and merge and causal softmax,
    # PyTorch's fused kernels (flash, memory-efficient, cuDNN's), whose products are inside.
    ("attention (dtrain's products counted as GEMMs)",
     r"k_split_heads|k_merge_heads|k_causal_softmax|flash|fmha|sdpa|attention"),
    ("convolutions and matrix products",
     r"xmma|cutlass|nvjet|gemm|convolve|cask_plugin|kern_precompute_indices"),
    ("normalisation", r"k_bn_|k_channel_|batch_norm|k_layernorm|layer_norm"),
    ("embeddings", r"k_embedding|k_token_keys|embedding"),
    ("optimizer", r"k_sgd|k_adam|multi_tensor_apply|k_clip_by_norm|k_sum_squares|k_add_partials"),
    ("loss", r"softmax|xent|nll_loss"),
    ("elementwise and copies",
     r"k_act|k_add|k_fill|k_relu|elementwise_kernel|direct_copy|clamp|Functor"),
]
TO_US = {"ns": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3, "s": 1e6}


def kernel_rows(text):
    rows = []
    for m in KERNEL.finditer(text):
        unit = m.group(10)
        if unit not in TO_US:
            raise SystemExit(f"ncu_kernel_sums: unknown time unit {unit!r}")
        avg = float(m.group(13).replace(",", "")) * TO_US[unit]
        calls = int(m.group(8))
        grid = "x".join(m.group(i) for i in (2, 3, 4))
        rows.append(dict(name=m.group(1), grid=grid, calls=calls, avg_us=avg, total_us=avg * calls))
    return sorted(rows, key=lambda r: r["total_us"], reverse=True)


def family_of(name):
    for family, pattern in FAMILIES:
        if re.search(pattern, name):
            return family
    return "other"


def print_families(rows, total):
    sums = {}
    for r in rows:
        f = family_of(r["name"])
        us, calls = sums.get(f, (0.0, 0))
        sums[f] = (us + r["total_us"], calls + r["calls"])
    print()
    print("| family | total us | share | calls |")
    print("|---|---|---|---|")
    for f, (us, calls) in sorted(sums.items(), key=lambda kv: kv[1][0], reverse=True):
        print(f"| {f} | {us:.1f} | {100 * us / total:.1f}% | {calls} |")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("ncu_output")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--steps", type=int, default=0)
    ap.add_argument("--families", action="store_true")
    a = ap.parse_args()
    with open(a.ncu_output, errors="replace") as f:
        rows = kernel_rows(f.read())
    if not rows:
        raise SystemExit(f"ncu_kernel_sums: no per-kernel summary in {a.ncu_output}")
    total = sum(r["total_us"] for r in rows)
    calls = sum(r["calls"] for r in rows)
    per_step = f", {total / a.steps:.0f} us a step over {a.steps} steps" if a.steps else ""
    print(f"{a.ncu_output}: {len(rows)} kernels, {calls} launches, {total:.0f} us{per_step}")
    print("| total us | share | calls | avg us | kernel | grid |")
    print("|---|---|---|---|---|---|")
    for r in rows[:a.top]:
        name = r["name"] if len(r["name"]) <= 90 else r["name"][:87] + "..."
        print(f"| {r['total_us']:.1f} | {100 * r['total_us'] / total:.1f}% | {r['calls']} | "
              f"{r['avg_us']:.2f} | `{name}` | {r['grid']} |")
    if a.families:
        print_families(rows, total)


if __name__ == "__main__":
    main()
