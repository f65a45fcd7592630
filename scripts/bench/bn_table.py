#!/usr/bin/env python3
"""Summarises a BatchNorm study over seeds: final test accuracy per (replicas, batch, BatchNorm)
as mean, standard deviation and the per-seed values, and the difference to the 1-replica run of
the same seed. Usage: bn_table.py RESULTS_DIR (as written by scripts/bn-study.sh)."""
import glob
import json
import os
import statistics
import sys

root = sys.argv[1]
rows = {}
base = {}
lrs = {}
for s in glob.glob(os.path.join(root, "*", "*", "summary.json")):
    d = json.load(open(s))
    cfg_path = os.path.join(os.path.dirname(s), "config.resolved.yaml")
    text = open(cfg_path).read()
    def val(key, section):
        block = text.split(f"\n{section}:", 1)[1] if section else text
        for line in block.splitlines():
            if line.strip().startswith(key + ":"):
                return line.split(":", 1)[1].split("#", 1)[0].strip()
        return "?"
    gpus = int(val("gpus", None))
    seed = int(val("seed", "train"))
    batch = int(val("per_replica_batch", "train"))
    bn = val("batchnorm", "model")
    acc = 100 * d["final_test_accuracy"]
    lrs[(gpus, batch)] = d.get("peak_lr", float("nan"))
    if gpus == 1:
        base[seed] = acc
        key = (1, batch, "(one replica)")
    else:
        key = (gpus, batch, bn)
    rows.setdefault(key, {})[seed] = acc

print("# Local against synchronised BatchNorm on the small CNN, over seeds\n")
print("configs/fmnist-cnn.yaml on Fashion-MNIST (15 epochs, linear LR scaling from 0.05 at batch "
      "64, 2 warmup epochs, cosine). Final test accuracy; the last column compares each run "
      "with the 1-replica run of the same seed. Written by scripts/bn-study.sh.\n")
print("| replicas x batch (global) | BatchNorm | peak LR | seeds | final test acc, mean (sd) | per seed | "
      "against 1 replica, mean (per seed) |")
print("|---|---|---|---|---|---|---|")
for (g, b, bn), accs in sorted(rows.items(), key=lambda kv: (kv[0][0], -kv[0][1], kv[0][2])):
    seeds = sorted(accs)
    vals = [accs[s] for s in seeds]
    sd = statistics.stdev(vals) if len(vals) > 1 else 0.0
    deltas = [accs[s] - base[s] for s in seeds if s in base] if g > 1 else []
    dtxt = (f"{statistics.mean(deltas):+.2f} (" + ", ".join(f"{x:+.2f}" for x in deltas) + ")"
            if deltas else "")
    print(f"| {g} x {b} ({g * b}) | {bn} | {lrs[(g, b)]:g} | {', '.join(map(str, seeds))} | "
          f"{statistics.mean(vals):.2f}% ({sd:.2f}) | "
          f"{', '.join(f'{v:.2f}' for v in vals)} | {dtxt} |")
