#!/usr/bin/env python3
"""GPU benchmark: dtrain's CUDA backend against PyTorch in each of its ways to run a step, on
the same GPU, in one invocation. Fashion-MNIST with the data already on the GPU; the quickstart
MLP and the small CNN (configs/fmnist-cnn.yaml), each at batch 128 (linear LR scaling) and 1024
(sqrt), fp32 with TF32 off on both sides.

Per repeat and case, one after another: dtrain with its step in a CUDA graph (the default) and
with train.cuda_graph=false, then PyTorch (scripts/bench/torch_mlp.py) in the modes asked for:
  eager        kernels launched one by one, the default (for-each) SGD
  graph        the whole step (gather, forward, backward, fused SGD) captured in one CUDA graph
  compile      torch.compile, default mode, fused SGD
  compile-max  torch.compile mode="max-autotune" (Triton GEMM autotuning and CUDA graphs)
Every side trains the same steps; warm-up, capture, compilation and autotuning fall in the
first epoch, which is reported on its own. The figure compared is the steady state: the median
of each run's epochs after the first, then the median over the repeats. The speedup of a mode
is its steady epoch time over dtrain's (graph), and "best" is the fastest PyTorch mode.

Usage: gpu_vs_pytorch.py --dtrain build/apps/dtrain --out DIR [--models mlp,cnn]
       [--batches 128,1024] [--modes eager,graph,compile,compile-max] [--epochs 4] [--repeats 2]
Writes DIR/gpu-vs-pytorch-<models>.json and .md (one row function renders both).
"""
import argparse
import csv
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
CONFIGS = {"mlp": ("quickstart.yaml", "fmnist-mlp"), "cnn": ("fmnist-cnn.yaml", "fmnist-cnn")}
SCALING = {128: "linear", 1024: "sqrt"}


def epoch_times(metrics_csv):
    with open(metrics_csv) as f:
        return [float(r["epoch_time_s"]) for r in csv.DictReader(f)]


def first_and_steady(times):
    return times[0], statistics.median(times[1:]) if len(times) > 1 else times[0]


def run_dtrain(a, model, batch, results, tag, graph):
    cfg, name = CONFIGS[model]
    cmd = [a.dtrain, "run", os.path.join(ROOT, "configs", cfg), "backend=cuda",
           f"data.path={a.data}", f"precision={a.precision}", f"train.per_replica_batch={batch}",
           f"train.cuda_graph={'true' if graph else 'false'}",
           f"optimizer.lr_scaling={SCALING.get(batch, 'linear')}", f"train.epochs={a.epochs}",
           "--results", results, "--tag", tag, "--quiet"]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, timeout=a.timeout)
    run_dir = os.path.join(results, name, f"{tag}-g1")
    with open(os.path.join(run_dir, "summary.json")) as f:
        s = json.load(f)
    first, steady = first_and_steady(epoch_times(os.path.join(run_dir, "metrics.csv")))
    return dict(first=first, steady=steady, acc=s["final_test_accuracy"],
                steps=s["steps_per_epoch"], graph=s.get("cuda_graph", "?"))


def run_torch(a, model, batch, mode):
    cmd = [a.python, os.path.join(HERE, "torch_mlp.py"), "--device=cuda", f"--model={model}",
           f"--batch={batch}", f"--epochs={a.epochs}", f"--scaling={SCALING.get(batch, 'linear')}",
           "--threads=1", f"--data={a.data}", f"--mode={mode}", f"--precision={a.precision}"]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=a.timeout)
    except subprocess.TimeoutExpired:
        return dict(error=f"timed out after {a.timeout} s")
    line = next((l for l in p.stdout.splitlines() if l.startswith("SUMMARY ")), None)
    if p.returncode != 0 or line is None:
        tail = (p.stderr or p.stdout).strip().splitlines()[-3:]
        return dict(error=f"exit {p.returncode}: " + " | ".join(tail))
    s = json.loads(line[len("SUMMARY "):])
    return dict(first=s["first_epoch_time_s"], steady=s["steady_epoch_time_s"],
                acc=s["final_test_acc"], torch=s["torch"])


def med(runs, key):
    vals = [r[key] for r in runs if key in r]
    return statistics.median(vals) if vals else None


def measure_case(a, model, batch, scratch):
    sides = {"dtrain": [], "dtrain-eager": []}
    sides.update({m: [] for m in a.modes})
    for rep in range(a.repeats):
        tag = f"{model}-b{batch}-r{rep}"
        sides["dtrain"].append(run_dtrain(a, model, batch, scratch, tag, True))
        sides["dtrain-eager"].append(run_dtrain(a, model, batch, scratch, tag + "-eager", False))
        for m in a.modes:
            sides[m].append(run_torch(a, model, batch, m))
        said = ", ".join(f"{k} {v[-1]['steady']:.4f}" if "steady" in v[-1] else
                         f"{k} {v[-1]['error']}" for k, v in sides.items())
        print(f"{model} batch {batch} repeat {rep + 1} (steady s/epoch): {said}", flush=True)
    return sides


def case_row(model, batch, sides, modes):
    """One row of the results, the same for the JSON and the table."""
    d = sides["dtrain"]
    row = dict(model=model, batch=batch, steps=d[0]["steps"], graph=d[0]["graph"],
               dtrain_first_s=med(d, "first"), dtrain_steady_s=med(d, "steady"),
               dtrain_step_us=med(d, "steady") / d[0]["steps"] * 1e6,
               dtrain_eager_steady_s=med(sides["dtrain-eager"], "steady"),
               dtrain_acc=med(d, "acc"), modes={})
    for m in modes:
        runs = sides[m]
        ok = [r for r in runs if "steady" in r]
        entry = dict(first_s=med(ok, "first"), steady_s=med(ok, "steady"), acc=med(ok, "acc"),
                     errors=[r["error"] for r in runs if "error" in r])
        if ok:
            ratios = [r["steady"] / x["steady"] for r, x in zip(runs, d) if "steady" in r]
            entry.update(speedup=statistics.median(ratios), speedup_min=min(ratios),
                         speedup_max=max(ratios))
        row["modes"][m] = entry
    done = {m: e for m, e in row["modes"].items() if e["steady_s"] is not None}
    row["best_mode"] = min(done, key=lambda m: done[m]["steady_s"]) if done else None
    return row


def fmt(v, spec):
    return "-" if v is None else format(v, spec)


def table_lines(rows, modes):
    head = ("| model | batch | dtrain s/epoch (first) | dtrain eager | "
            + " | ".join(f"PyTorch {m} (first)" for m in modes)
            + " | best PyTorch mode | dtrain vs best | dtrain acc | best's acc |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        cells = [r["model"], str(r["batch"]),
                 f"{fmt(r['dtrain_steady_s'], '.4f')} ({fmt(r['dtrain_first_s'], '.3f')})",
                 fmt(r["dtrain_eager_steady_s"], ".4f")]
        for m in modes:
            e = r["modes"][m]
            cells.append("failed" if e["steady_s"] is None else
                         f"{e['steady_s']:.4f} ({e['first_s']:.2f})")
        b = r["modes"].get(r["best_mode"]) if r["best_mode"] else None
        cells += [r["best_mode"] or "-",
                  "-" if b is None else
                  f"{b['speedup']:.2f}x ({b['speedup_min']:.2f}-{b['speedup_max']:.2f})",
                  f"{100 * r['dtrain_acc']:.2f}%", "-" if b is None else f"{100 * b['acc']:.2f}%"]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtrain", default=os.path.join(ROOT, "build", "apps", "dtrain"))
    ap.add_argument("--python", default=sys.executable, help="a python with torch (CUDA)")
    ap.add_argument("--out", default=os.path.join(ROOT, "results", "gpu"))
    ap.add_argument("--models", default="mlp,cnn")
    ap.add_argument("--batches", default="128,1024")
    ap.add_argument("--modes", default="eager,graph,compile,compile-max")
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--timeout", type=int, default=300, help="seconds per training process")
    ap.add_argument("--data", default="/usr/share/datasets/fashion-mnist",
                    help="folder with the four Fashion-MNIST IDX files")
    ap.add_argument("--precision", default="fp32", choices=["fp32", "tf32"])
    a = ap.parse_args()
    a.modes = a.modes.split(",")
    models, batches = a.models.split(","), [int(b) for b in a.batches.split(",")]
    if a.epochs < 2:
        sys.exit("gpu_vs_pytorch: --epochs must be at least 2 (the first is warm-up)")
    os.makedirs(a.out, exist_ok=True)
    dev = json.loads(subprocess.run([a.dtrain, "devices", "--json"], check=True,
                                    capture_output=True, text=True).stdout)
    if not dev["gpus"]:
        sys.exit(f"gpu_vs_pytorch: no GPU ({dev['no_gpu_reason']})")
    scratch = tempfile.mkdtemp(prefix="dtrain-gpu-bench-")
    rows, torch_version = [], None
    stem = os.path.join(a.out, "gpu-vs-pytorch-" + "-".join(models))
    for model in models:
        for batch in batches:
            sides = measure_case(a, model, batch, scratch)
            rows.append(case_row(model, batch, sides, a.modes))
            torch_version = torch_version or next(
                (r["torch"] for m in a.modes for r in sides[m] if "torch" in r), None)
            # After every case, so that a call cut short keeps the cases it finished.
            lines = write_results(a, stem, dev, torch_version, rows)
    print("\n".join(lines))


def write_results(a, stem, dev, torch_version, rows):
    meta = dict(date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                gpu=dev["gpus"][0]["name"], driver=dev["driver"], cuda=dev["cuda_runtime"],
                torch=torch_version, precision=a.precision, epochs=a.epochs,
                repeats=a.repeats, modes=a.modes)
    with open(stem + ".json", "w") as f:
        json.dump(dict(meta=meta, rows=rows), f, indent=2)
    lines = [f"# dtrain's CUDA backend against PyTorch on {meta['gpu']}", "",
             f"{meta['date']}, driver {meta['driver']}, CUDA {meta['cuda']}, torch "
             f"{meta['torch']}, {a.precision} (TF32 off on both sides), data on the GPU, "
             f"{a.epochs} epochs x {a.repeats} alternating repeats.", "",
             "Seconds per epoch in steady state (median of the epochs after the first, then "
             "of the repeats); the first epoch (warm-up, capture, compilation) in brackets. "
             "dtrain vs best: the fastest PyTorch mode's steady time over dtrain's (graph), "
             "median and range over the repeats.", ""] + table_lines(rows, a.modes)
    errors = [f"- {r['model']} b{r['batch']} {m}: {err}" for r in rows
              for m, e in r["modes"].items() for err in e["errors"]]
    if errors:
        lines += ["", "Runs that failed:"] + errors
    with open(stem + ".md", "w") as f:
        f.write("\n".join(lines) + "\n")
    return lines


if __name__ == "__main__":
    main()
