#!/usr/bin/env python3
"""Straggler trials: one rank of a 2-replica run slowed on purpose in one phase (DTRAIN_SLOW,
the test facility that stretches that rank's phase to FACTOR times its time), and runs with no
slowdown; does the epoch's verdict name the right rank and phase, and only then?

The run: a 2.7M-parameter MLP (hidden 96, 64) on augmented synthetic 3x96x96 images, so that
every phase is a sizeable share of the step (on 2 cores, each phase takes 2 to 5 ms), 2
replicas as threads with 1 thread each, one epoch of 16 steps. Writes results/stragglers/README.md and trials.json.

With --launch mpirun the two replicas are two processes (mpirun -np 2, each bound to a core of
its own), as on two machines; the default runs them as threads of one process. With --launch
turns they take turns on one thread (replicas: shared, threads: 1): both ranks' phases run on
the same core, so that a difference between the machine's cores cannot pass for a straggler;
each rank adds its gradients into the shared sum in its turn (its exchange, timed alone) and
updates its own half of the shared weights. Results go to results/stragglers/ (threads),
results/stragglers/mpirun/ or results/stragglers/turns/.

With --cores, no trials: the same run at one replica, pinned to each core in turn (taskset),
several rounds, each phase's median time from the step trace: how much the machine's own cores
differ, which a straggler rule sees as a straggler when ranks run on different cores. Writes
results/stragglers/cores.md.

--phases limits the phases slowed; --set KEY=VALUE adds an override to every run (for example
optimizer.type=adamw, whose update is a larger share of the step than SGD's). --gpus N runs N
replicas (rank 1 slowed); --turn-threads T has --launch turns run them in turn on T threads.

Usage: stragglers.py [--dtrain build/apps/dtrain] [--trials 10] [--factors 1.1,1.5]
                     [--launch threads|mpirun|turns] [--phases P,...] [--set KEY=VALUE]...
                     [--out DIR] [--cores]
"""
import argparse
import collections
import json
import os
import shlex
import statistics
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
  synthetic: {train_size: 2048, test_size: 128, shape: [3, 96, 96], classes: 10}
  augment: {crop_padding: 4, flip: true}
model: {hidden: [96, 64]}
train: {epochs: 1, per_replica_batch: 64, target_accuracy: 0}
optimizer: {lr: 0.05, base_batch: 64}
"""


def trial(args, work, tag, slow):
    env = dict(os.environ)
    env.pop("DTRAIN_SLOW", None)
    if slow:
        env["DTRAIN_SLOW"] = slow
    # The step trace (steps 2-16) gives each rank's phase times beside the verdict.
    cmd = [args.dtrain, "run", os.path.join(work, "s.yaml"), f"gpus={args.gpus}",
           "train.trace.from_step=2",
           "train.trace.steps=15", *args.set, "--results", work, "--tag", tag, "--quiet"]
    if args.launch == "mpirun":
        mpi = ["mpirun", "--allow-run-as-root", "-np", str(args.gpus), "--bind-to", "core",
               "--mca", "btl", "self,vader", "--mca", "btl_vader_single_copy_mechanism", "none"]
        cmd = mpi + (["-x", "DTRAIN_SLOW"] if slow else []) + cmd  # to both processes
    elif args.launch == "turns":
        cmd[4:4] = ["replicas=shared", f"threads={args.turn_threads}"]
    else:
        cmd.insert(4, "replicas=threads")
    subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    run = os.path.join(work, "s", f"{tag}-g{args.gpus}")
    with open(os.path.join(run, "summary.json")) as f:
        named = json.load(f).get("stragglers", [])
    return (named[0] if named else None), phase_medians(os.path.join(run, "trace.json"))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--dtrain", default=os.path.join(ROOT, "build", "apps", "dtrain"))
    p.add_argument("--trials", type=int, default=10)
    p.add_argument("--factors", default="1.1,1.5")
    p.add_argument("--launch", choices=["threads", "mpirun", "turns"], default="threads")
    p.add_argument("--out", default=None)
    p.add_argument("--phases", default=None,
                   help="comma list of the phases to slow (default: all five)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="an override for every run (repeatable), e.g. optimizer.type=adamw")
    p.add_argument("--cores", action="store_true")
    p.add_argument("--gpus", type=int, default=2, help="replicas a run (rank 1 is slowed)")
    p.add_argument("--turn-threads", type=int, default=1,
                   help="--launch turns: the threads the replicas take turns on")
    args = p.parse_args()
    if args.cores:
        return cores(args)
    if args.out is None:
        args.out = os.path.join(ROOT, "results", "stragglers",
                                *([] if args.launch == "threads" else [args.launch]))
    factors = [float(x) for x in args.factors.split(",")]
    rows = []
    with tempfile.TemporaryDirectory() as work:
        with open(os.path.join(work, "s.yaml"), "w") as f:
            f.write(CONFIG)
        phases = PHASES
        if args.phases:
            wanted = args.phases.split(",")
            bad = [p for p in wanted if p not in phases]
            if bad:
                raise SystemExit(f"stragglers: --phases: {', '.join(bad)} is not one of "
                                 f"{', '.join(phases)}")
            phases = wanted
        cases = [(None, None)] + [(f, ph) for f in factors for ph in phases]
        for t in range(args.trials):  # trials interleaved: drift on the machine hits all cases
            for factor, phase in cases:
                tag = f"t{t}-{phase or 'none'}-{factor or 1}"
                named, ms = trial(args, work, tag, f"1:{phase}:{factor}" if phase else None)
                ok = (named is None) if phase is None else (
                    named is not None and named["rank"] == 1 and named["phase"] == phase)
                rows.append(dict(trial=t + 1, factor=factor, phase=phase, named=named, correct=ok,
                                 phase_ms=ms))
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "trials.json"), "w") as f:
        json.dump(rows, f, indent=1)
    render(args, rows, factors)


def phase_medians(trace_path):
    """Per rank (the trace's pid) and phase, the median over steps of the phase's time in a step
    (the sum of its spans there), in milliseconds."""
    with open(trace_path) as f:
        events = json.load(f)["traceEvents"]
    per_step = collections.defaultdict(float)
    for e in events:
        # A bucket's span is named "bucket K"; its category is "bucket".
        name = "bucket" if e.get("cat") == "bucket" else e.get("name")
        if e.get("ph") == "X" and name in PHASES + ["bucket"]:
            per_step[(e["pid"], name, e.get("args", {}).get("step"))] += e["dur"] / 1000
    spans = collections.defaultdict(list)
    for (pid, name, _), ms in per_step.items():
        spans[(pid, name)].append(ms)
    ranks = sorted({pid for pid, _ in spans})
    return {str(r): {ph: statistics.median(spans[(r, ph)]) if spans[(r, ph)] else None
                     for ph in PHASES + ["bucket"]} for r in ranks}


def cores(args):
    rounds = args.trials
    rows = []
    with tempfile.TemporaryDirectory() as work:
        with open(os.path.join(work, "s.yaml"), "w") as f:
            f.write(CONFIG)
        for t in range(rounds):
            for core in range(os.cpu_count()):
                tag = f"r{t}-c{core}"
                subprocess.run(["taskset", "-c", str(core), args.dtrain, "run",
                                os.path.join(work, "s.yaml"), "gpus=1", "train.trace.from_step=2",
                                "train.trace.steps=15", "--results", work, "--tag", tag,
                                "--quiet"], check=True, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
                rows.append((t + 1, core, phase_medians(
                    os.path.join(work, "s", f"{tag}-g1", "trace.json"))["0"]))
    lines = ["# How much this machine's cores differ", "",
             f"{time.strftime('%Y-%m-%d', time.gmtime())}, `scripts/bench/stragglers.py --cores "
             f"--trials {rounds}` on {os.cpu_count()} cores: the trials' run at one replica "
             "pinned to one core (`taskset -c CORE`), the cores in turn, each round a few "
             "seconds apart; the median time of each phase over steps 2-16 (step trace), "
             "milliseconds. The exchange is empty at one replica.", "",
             "| round | core | " + " | ".join(p for p in PHASES if p != "exchange") + " |",
             "|---|---|" + "---|" * (len(PHASES) - 1)]
    for t, core, med in rows:
        lines.append(f"| {t} | {core} | " + " | ".join(
            f"{med[p]:.2f}" if med[p] is not None else "-" for p in PHASES if p != "exchange")
            + " |")
    fwd = [med["forward"] for _, _, med in rows]
    lines += ["", f"Forward: {min(fwd):.2f} to {max(fwd):.2f} ms "
              f"({max(fwd) / min(fwd):.2f}x) over the {len(rows)} runs.", ""]
    out = args.out or os.path.join(ROOT, "results", "stragglers")
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "cores.md"), "w") as f:
        f.write("\n".join(lines))
    print("\n".join(lines))


def render(args, rows, factors):
    tally = collections.OrderedDict()
    for r in rows:
        key = (r["factor"], r["phase"])
        tally.setdefault(key, []).append(r)
    lines = ["# Stragglers named: trials", "",
             f"{time.strftime('%Y-%m-%d', time.gmtime())}, `scripts/bench/stragglers.py "
             f"--trials {args.trials} --factors {args.factors} --launch {args.launch}"
             + (f" --phases {args.phases}" if args.phases else "")
             + "".join(f" --set {shlex.quote(kv)}" for kv in args.set)
             + (f" --gpus {args.gpus}" if args.gpus != 2 else "")
             + (f" --turn-threads {args.turn_threads}" if args.turn_threads != 1 else "")
             + "` on "
             f"{os.cpu_count()} cores. Rank 1 of a {args.gpus}-replica run "
             + {"mpirun": f"({args.gpus} processes under mpirun, each bound to a core, 1 thread "
                          "each)",
                "turns": (f"(in turn on {args.turn_threads} threads" if args.turn_threads > 1
                          else "(in turn on one thread") + ", sharing one copy of the weights)",
                "threads": "(threads, 1 each)"}[args.launch]
             + " slowed in one phase by the factor "
             f"(`DTRAIN_SLOW=1:PHASE:FACTOR`), or not at all; one epoch of "
             f"{2048 // (64 * args.gpus)} steps of a "
             + ("2.7M-parameter MLP on augmented 3x96x96 images" if not args.set else
                "run changed by the overrides above (without them, a 2.7M-parameter MLP on "
                "augmented 3x96x96 images)")
             + "; the epoch's verdict from "
             "`summary.json`. Right: the slowed rank and phase named (no slowdown: no one named). "
             "`all`: a rank slower in every phase alike (its core), named where no phase stands "
             "out.",
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
    # The machine's own difference between the ranks: the runs with no slowdown.
    calm = [r["phase_ms"] for r in rows if r["phase"] is None and r.get("phase_ms")]
    ratios = []
    for ph in ("data", "forward", "bucket"):
        v = [m["1"][ph] / m["0"][ph] for m in calm
             if "0" in m and "1" in m and m["0"].get(ph) and m["1"].get(ph)]
        if v:
            ratios.append(f"{ph} {statistics.median(v):.2f} ({min(v):.2f}-{max(v):.2f})")
    if ratios:
        lines += ["", "With no slowdown, rank 1's median phase time over rank 0's (steps 2-16, "
                  "the step trace; median of the runs, and their range): " + ", ".join(ratios)
                  + " (bucket: the exchange's bucket spans, a step's sum; with shared weights "
                  "a rank's own fold into the sum)."
                  + (" With synchronised BatchNorm the trace's forward and backward spans hold "
                     "its exchanges, waits included, which the verdict leaves out."
                     if "model.batchnorm=sync" in args.set else "")]
    lines += ["", "Per trial: trials.json.", ""]
    with open(os.path.join(args.out, "README.md"), "w") as f:
        f.write("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
