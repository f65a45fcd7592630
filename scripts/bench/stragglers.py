#!/usr/bin/env python3
"""Straggler trials: one rank of a 2-replica run slowed on purpose in one phase (DTRAIN_SLOW,
the test facility that stretches that rank's phase to FACTOR times its time), and runs with no
slowdown; does the epoch's verdict name the right rank and phase, and only then?

The run: a 6.4M-parameter MLP on augmented synthetic 3x32x32 images (phases of milliseconds:
data about 1, forward and backward about 10, exchange and optimizer a few), 2 replicas as
threads with 1 thread each, one epoch of 16 steps. Writes results/stragglers/README.md and
trials.json.

With --launch mpirun the two replicas are two processes (mpirun -np 2, each bound to a core of
its own), as on two machines; the default runs them as threads of one process. Results go to
results/stragglers/ (threads) or results/stragglers/mpirun/.

Usage: stragglers.py [--dtrain build/apps/dtrain] [--trials 10] [--factors 1.1,1.5]
                     [--launch threads|mpirun]
"""
import argparse
import collections
import json
import os
import subprocess
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
PHASES = ["data", "forward", "backward", "exchange", "optimizer"]
CONFIG = """name: s
threads: 1
data:
  dataset: synthetic
  synthetic: {train_size: 2048, test_size: 128, shape: [3, 32, 32], classes: 10}
  augment: {crop_padding: 4, flip: true}
model: {hidden: [1024, 256]}
train: {epochs: 1, per_replica_batch: 64, target_accuracy: 0}
optimizer: {lr: 0.05, base_batch: 64}
"""


def trial(args, work, tag, slow):
    env = dict(os.environ)
    env.pop("DTRAIN_SLOW", None)
    if slow:
        env["DTRAIN_SLOW"] = slow
    cmd = [args.dtrain, "run", os.path.join(work, "s.yaml"), "gpus=2", "--results", work,
           "--tag", tag, "--quiet"]
    if args.launch == "mpirun":
        mpi = ["mpirun", "--allow-run-as-root", "-np", "2", "--bind-to", "core", "--mca", "btl",
               "self,vader", "--mca", "btl_vader_single_copy_mechanism", "none"]
        cmd = mpi + (["-x", "DTRAIN_SLOW"] if slow else []) + cmd  # to both processes
    else:
        cmd.insert(4, "replicas=threads")
    subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    with open(os.path.join(work, "s", f"{tag}-g2", "summary.json")) as f:
        named = json.load(f).get("stragglers", [])
    return named[0] if named else None


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--dtrain", default=os.path.join(ROOT, "build", "apps", "dtrain"))
    p.add_argument("--trials", type=int, default=10)
    p.add_argument("--factors", default="1.1,1.5")
    p.add_argument("--launch", choices=["threads", "mpirun"], default="threads")
    p.add_argument("--out", default=None)
    args = p.parse_args()
    if args.out is None:
        args.out = os.path.join(ROOT, "results", "stragglers",
                                *(["mpirun"] if args.launch == "mpirun" else []))
    factors = [float(x) for x in args.factors.split(",")]
    rows = []
    with tempfile.TemporaryDirectory() as work:
        with open(os.path.join(work, "s.yaml"), "w") as f:
            f.write(CONFIG)
        cases = [(None, None)] + [(f, ph) for f in factors for ph in PHASES]
        for t in range(args.trials):  # trials interleaved: drift on the machine hits all cases
            for factor, phase in cases:
                tag = f"t{t}-{phase or 'none'}-{factor or 1}"
                named = trial(args, work, tag, f"1:{phase}:{factor}" if phase else None)
                ok = (named is None) if phase is None else (
                    named is not None and named["rank"] == 1 and named["phase"] == phase)
                rows.append(dict(trial=t + 1, factor=factor, phase=phase, named=named, correct=ok))
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "trials.json"), "w") as f:
        json.dump(rows, f, indent=1)
    render(args, rows, factors)


def render(args, rows, factors):
    tally = collections.OrderedDict()
    for r in rows:
        key = (r["factor"], r["phase"])
        tally.setdefault(key, []).append(r)
    lines = ["# Stragglers named: trials", "",
             f"{time.strftime('%Y-%m-%d', time.gmtime())}, `scripts/bench/stragglers.py "
             f"--trials {args.trials} --factors {args.factors} --launch {args.launch}` on "
             f"{os.cpu_count()} cores. Rank 1 of a 2-replica run "
             + ("(2 processes under mpirun, each bound to a core, 1 thread each)"
                if args.launch == "mpirun" else "(threads, 1 each)")
             + " slowed in one phase by the factor "
             "(`DTRAIN_SLOW=1:PHASE:FACTOR`), or not at all; one epoch of 16 steps of a "
             "6.4M-parameter MLP on augmented 3x32x32 images; the epoch's verdict from "
             "`summary.json`. Right: the slowed rank and phase named (no slowdown: no one named).",
             "", "| slowdown | phase | right | trials | what was named (rank phase: count) |",
             "|---|---|---|---|---|"]
    for (factor, phase), rs in tally.items():
        named = collections.Counter(f"{r['named']['rank']} {r['named']['phase']}"
                                    if r["named"] else "none" for r in rs)
        excess = [r["named"]["excess"] for r in rs
                  if r["named"] and r["named"]["excess"] is not None]
        what = ", ".join(f"{k}: {v}" for k, v in named.most_common())
        if excess:
            what += f" (median excess {sorted(excess)[len(excess) // 2]:+.0%})"
        lines.append(f"| {'none' if factor is None else f'x{factor}'} | {phase or '-'} | "
                     f"{sum(r['correct'] for r in rs)} | {len(rs)} | {what} |")
    lines += ["", "Per trial: trials.json.", ""]
    with open(os.path.join(args.out, "README.md"), "w") as f:
        f.write("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
