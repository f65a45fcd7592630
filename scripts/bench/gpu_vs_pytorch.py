#!/usr/bin/env python3
"""GPU benchmark: dtrain's CUDA backend against PyTorch in each of its ways to run a step, on
the same GPU, in one invocation, with the data already on the GPU. The models (--models):
  mlp, cnn   the quickstart MLP and the small CNN (configs/fmnist-cnn.yaml) on Fashion-MNIST,
             at batch 128 (linear LR scaling) and 1024 (sqrt), fp32 with TF32 off on both sides
  resnet18   the CIFAR ResNet-18 (configs/cifar10-resnet18.yaml, 11.2M parameters) on 50,176
             synthetic 3x32x32 images an epoch, batch 128, bf16; PyTorch in channels-last
             (dtrain's CUDA backend keeps NCHW). Each program draws its own random images, so
             accuracies do not compare.
  gpt        nanoGPT's character-level Shakespeare size (6 layers, 6 heads, width 384, block
             256, batch 64; configs/bytes-gpt.yaml resized) on the bytes of this repository's
             lib/ folder, which both programs read alike (scripts/bench/torch_gpt.py, whose
             eager mode already has the fused AdamW); bf16; the validation loss in nats a byte
             compared. PyTorch's graph mode is not run. The corpus changes with the commit, so
             GPT rows compare the two programs of one run, not runs of different commits.
--precision replaces each model's precision (fp32 for mlp and cnn, bf16 for the others).

Per repeat and case, one after another: dtrain with its step in a CUDA graph (the default) and
with train.cuda_graph=false, then PyTorch (scripts/bench/torch_mlp.py; torch_gpt.py for the GPT)
in the modes asked for:
  eager        kernels launched one by one, the default (for-each) SGD
  graph        the whole step (gather, forward, backward, fused SGD) captured in one CUDA graph
  compile      torch.compile, default mode, fused SGD
  compile-max  torch.compile mode="max-autotune" (Triton GEMM autotuning and CUDA graphs)
Every side trains the same steps; warm-up, capture, compilation and autotuning fall in the
first epoch, which is reported on its own. The figure compared is the steady state: the median
of each run's epochs after the first, then the median over the repeats. The speedup of a mode
is its steady epoch time over dtrain's (graph), and "best" is the fastest PyTorch mode.

Usage: gpu_vs_pytorch.py --dtrain build/apps/dtrain --out DIR [--models mlp,cnn,resnet18,gpt]
       [--batches 128,1024 (default: each model's)] [--modes eager,graph,compile,compile-max] [--epochs 4] [--repeats 2]
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
SCALING = {128: "linear", 1024: "sqrt"}
SYNTHETIC_TRAIN = 50176  # 392 steps of 128, 49 of 1024
# Each model: dtrain's config and the overrides that make its run, the peer script and its
# arguments (batch, epochs, mode and precision are added per run), the default batches and
# precision, and what measures the result ("acc": test accuracy, "loss": validation loss,
# None: synthetic labels, nothing to compare).
MODELS = {
    "mlp": dict(config="quickstart.yaml", experiment="fmnist-mlp", dtrain=[],
                peer="torch_mlp.py", torch=["--model=mlp"], batches=[128, 1024],
                precision="fp32", quality="acc", data=True),
    "cnn": dict(config="fmnist-cnn.yaml", experiment="fmnist-cnn", dtrain=[],
                peer="torch_mlp.py", torch=["--model=cnn"], batches=[128, 1024],
                precision="fp32", quality="acc", data=True),
    "resnet18": dict(
        config="cifar10-resnet18.yaml", experiment="cifar10-resnet18",
        dtrain=["data.dataset=synthetic", "data.synthetic.shape=[3,32,32]",
                f"data.synthetic.train_size={SYNTHETIC_TRAIN}", "data.synthetic.test_size=1024",
                "data.augment.flip=false", "data.augment.crop_padding=0"],
        peer="torch_mlp.py",
        torch=["--model=resnet", "--depth=18", "--widths=64,128,256,512", "--synthetic=3,32,32",
               f"--train-size={SYNTHETIC_TRAIN}", "--test-size=1024", "--lr=0.1",
               "--base-batch=128", "--warmup=2", "--channels-last"],
        batches=[128], precision="bf16", quality=None, data=False),
    "gpt": dict(
        config="bytes-gpt.yaml", experiment="bytes-gpt",
        dtrain=[f"data.path={os.path.join(ROOT, 'lib')}", "data.exclude=[]", "data.sha256=''",
                "data.block_size=256", "model.n_layer=6", "model.n_head=6", "model.n_embd=384",
                "optimizer.base_batch=64"],
        peer="torch_gpt.py",
        torch=[f"--data={os.path.join(ROOT, 'lib')}", "--block=256", "--n-layer=6",
               "--n-head=6", "--n-embd=384", "--lr=1e-3", "--warmup=0.5"],
        batches=[64], precision="bf16", quality="loss", data=False,
        no_modes=["graph", "eager-fused"]),
}


def epoch_times(metrics_csv):
    with open(metrics_csv) as f:
        return [float(r["epoch_time_s"]) for r in csv.DictReader(f)]


def first_and_steady(times):
    return times[0], statistics.median(times[1:]) if len(times) > 1 else times[0]


def precision(a, model):
    return a.precision or MODELS[model]["precision"]


def run_dtrain(a, model, batch, results, tag, graph):
    m = MODELS[model]
    scaling = [f"optimizer.lr_scaling={SCALING.get(batch, 'linear')}"] if m["data"] else []
    data = [f"data.path={a.data}"] if m["data"] else []
    cmd = [a.dtrain, "run", os.path.join(ROOT, "configs", m["config"]), "backend=cuda",
           *data, *m["dtrain"], *scaling, f"precision={precision(a, model)}",
           f"train.per_replica_batch={batch}", f"train.cuda_graph={'true' if graph else 'false'}",
           f"train.epochs={a.epochs}", "--results", results, "--tag", tag, "--quiet"]
    try:
        p = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                           timeout=a.timeout)
    except subprocess.TimeoutExpired:
        return dict(error=f"timed out after {a.timeout} s")
    if p.returncode != 0:
        tail = p.stderr.strip().splitlines()[-3:]
        return dict(error=f"exit {p.returncode}: " + " | ".join(tail))
    run_dir = os.path.join(results, m["experiment"], f"{tag}-g1")
    with open(os.path.join(run_dir, "summary.json")) as f:
        s = json.load(f)
    first, steady = first_and_steady(epoch_times(os.path.join(run_dir, "metrics.csv")))
    quality = {"acc": s["final_test_accuracy"], "loss": s["final_test_loss"]}.get(m["quality"])
    return dict(first=first, steady=steady, quality=quality,
                steps=s["steps_per_epoch"], graph=s.get("cuda_graph", "?"))


def run_torch(a, model, batch, mode):
    m = MODELS[model]
    cmd = [a.python, os.path.join(HERE, m["peer"]), "--device=cuda", *m["torch"],
           f"--batch={batch}", f"--epochs={a.epochs}", "--threads=1", f"--mode={mode}",
           f"--precision={precision(a, model)}"]
    if m["data"]:
        cmd += [f"--data={a.data}", f"--scaling={SCALING.get(batch, 'linear')}"]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=a.timeout)
    except subprocess.TimeoutExpired:
        return dict(error=f"timed out after {a.timeout} s")
    line = next((l for l in p.stdout.splitlines() if l.startswith("SUMMARY ")), None)
    if p.returncode != 0 or line is None:
        tail = (p.stderr or p.stdout).strip().splitlines()[-3:]
        return dict(error=f"exit {p.returncode}: " + " | ".join(tail))
    s = json.loads(line[len("SUMMARY "):])
    if s.get("compile_error"):  # torch_gpt.py ran eager instead: not the mode asked for
        return dict(error=f"{mode}: {s['compile_error']}")
    quality = {"acc": s.get("final_test_acc"), "loss": s.get("final_test_loss")}.get(m["quality"])
    # torch_gpt.py compiles in a warm-up pass before its first epoch: counted in the first.
    first = s["first_epoch_time_s"] + s.get("warmup_s", 0.0)
    return dict(first=first, steady=s["steady_epoch_time_s"], quality=quality, torch=s["torch"])


def med(runs, key):
    vals = [r[key] for r in runs if r.get(key) is not None]
    return statistics.median(vals) if vals else None


def modes_of(a, model):
    return [m for m in a.modes if m not in MODELS[model].get("no_modes", [])]


def measure_case(a, model, batch, scratch):
    sides = {"dtrain": [], "dtrain-eager": []}
    sides.update({m: [] for m in modes_of(a, model)})
    for rep in range(a.repeats):
        tag = f"{model}-b{batch}-r{rep}"
        sides["dtrain"].append(run_dtrain(a, model, batch, scratch, tag, True))
        sides["dtrain-eager"].append(run_dtrain(a, model, batch, scratch, tag + "-eager", False))
        for m in modes_of(a, model):
            sides[m].append(run_torch(a, model, batch, m))
        said = ", ".join(f"{k} {v[-1]['steady']:.4f}" if "steady" in v[-1] else
                         f"{k} {v[-1]['error']}" for k, v in sides.items())
        print(f"{model} batch {batch} repeat {rep + 1} (steady s/epoch): {said}", flush=True)
    return sides


def case_row(a, model, batch, sides):
    """One row of the results, the same for the JSON and the table."""
    d = sides["dtrain"]
    done_d = [r for r in d if "steady" in r]
    steps = done_d[0]["steps"] if done_d else None
    row = dict(model=model, batch=batch, precision=precision(a, model),
               quality=MODELS[model]["quality"], steps=steps,
               graph=done_d[0]["graph"] if done_d else None,
               dtrain_first_s=med(d, "first"), dtrain_steady_s=med(d, "steady"),
               dtrain_step_us=med(d, "steady") / steps * 1e6 if steps else None,
               dtrain_eager_steady_s=med(sides["dtrain-eager"], "steady"),
               dtrain_quality=med(d, "quality"), modes={},
               dtrain_errors=[r["error"] for k in ("dtrain", "dtrain-eager")
                              for r in sides[k] if "error" in r])
    for m in modes_of(a, model):
        runs = sides[m]
        ok = [r for r in runs if "steady" in r]
        entry = dict(first_s=med(ok, "first"), steady_s=med(ok, "steady"),
                     quality=med(ok, "quality"),
                     errors=[r["error"] for r in runs if "error" in r])
        ratios = [r["steady"] / x["steady"] for r, x in zip(runs, d)
                  if "steady" in r and "steady" in x]
        if ratios:
            entry.update(speedup=statistics.median(ratios), speedup_min=min(ratios),
                         speedup_max=max(ratios))
        row["modes"][m] = entry
    done = {m: e for m, e in row["modes"].items() if e["steady_s"] is not None}
    row["best_mode"] = min(done, key=lambda m: done[m]["steady_s"]) if done else None
    return row


def fmt(v, spec):
    return "-" if v is None else format(v, spec)


def quality_cell(kind, v):
    """Test accuracy in percent, validation loss in nats a byte, "-" where none compares."""
    if kind is None or v is None:
        return "-"
    return f"{100 * v:.2f}%" if kind == "acc" else f"{v:.3f} nats"


def table_lines(rows, modes):
    head = ("| model | batch | precision | dtrain s/epoch (first) | dtrain eager | "
            + " | ".join(f"PyTorch {m} (first)" for m in modes)
            + " | best PyTorch mode | dtrain vs best | dtrain result | best's result |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        cells = [r["model"], str(r["batch"]), r["precision"],
                 f"{fmt(r['dtrain_steady_s'], '.4f')} ({fmt(r['dtrain_first_s'], '.3f')})",
                 fmt(r["dtrain_eager_steady_s"], ".4f")]
        for m in modes:
            e = r["modes"].get(m)
            cells.append("not run" if e is None else "failed" if e["steady_s"] is None else
                         f"{e['steady_s']:.4f} ({e['first_s']:.2f})")
        b = r["modes"].get(r["best_mode"]) if r["best_mode"] else None
        cells += [r["best_mode"] or "-",
                  "-" if b is None or "speedup" not in b else
                  f"{b['speedup']:.2f}x ({b['speedup_min']:.2f}-{b['speedup_max']:.2f})",
                  quality_cell(r["quality"], r["dtrain_quality"]),
                  quality_cell(r["quality"], None if b is None else b["quality"])]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtrain", default=os.path.join(ROOT, "build", "apps", "dtrain"))
    ap.add_argument("--python", default=sys.executable, help="a python with torch (CUDA)")
    ap.add_argument("--out", default=os.path.join(ROOT, "results", "gpu"))
    ap.add_argument("--models", default="mlp,cnn")
    ap.add_argument("--batches", default="", help="default: each model's (see the top)")
    ap.add_argument("--modes", default="eager,graph,compile,compile-max")
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--timeout", type=int, default=300, help="seconds per training process")
    ap.add_argument("--data", default="/usr/share/datasets/fashion-mnist",
                    help="folder with the four Fashion-MNIST IDX files")
    ap.add_argument("--precision", default="", choices=["", "fp32", "tf32", "bf16"],
                    help="default: each model's (fp32 for mlp and cnn, bf16 for the others)")
    a = ap.parse_args()
    a.modes = a.modes.split(",")
    models = a.models.split(",")
    unknown = [m for m in models if m not in MODELS]
    if unknown:
        sys.exit(f"gpu_vs_pytorch: unknown model {unknown[0]} (valid: {', '.join(MODELS)})")
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
        batches = ([int(b) for b in a.batches.split(",")] if a.batches
                   else MODELS[model]["batches"])
        for batch in batches:
            sides = measure_case(a, model, batch, scratch)
            rows.append(case_row(a, model, batch, sides))
            torch_version = torch_version or next(
                (r["torch"] for runs in sides.values() for r in runs if "torch" in r), None)
            # After every case, so that a call cut short keeps the cases it finished.
            lines = write_results(a, stem, dev, torch_version, rows)
    print("\n".join(lines))


def write_results(a, stem, dev, torch_version, rows):
    meta = dict(date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                gpu=dev["gpus"][0]["name"], driver=dev["driver"], cuda=dev["cuda_runtime"],
                torch=torch_version, epochs=a.epochs,
                repeats=a.repeats, modes=a.modes)
    with open(stem + ".json", "w") as f:
        json.dump(dict(meta=meta, rows=rows), f, indent=2)
    lines = [f"# dtrain's CUDA backend against PyTorch on {meta['gpu']}", "",
             f"{meta['date']}, driver {meta['driver']}, CUDA {meta['cuda']}, torch "
             f"{meta['torch']}, TF32 off on both sides unless the precision is tf32, data on the GPU, "
             f"{a.epochs} epochs x {a.repeats} alternating repeats.", "",
             "Seconds per epoch in steady state (median of the epochs after the first, then "
             "of the repeats); the first epoch (warm-up, capture, compilation) in brackets. "
             "dtrain vs best: the fastest PyTorch mode's steady time over dtrain's (graph), "
             "median and range over the repeats.", ""] + table_lines(rows, a.modes)
    errors = [f"- {r['model']} b{r['batch']} dtrain: {err}" for r in rows
              for err in r["dtrain_errors"]]
    errors += [f"- {r['model']} b{r['batch']} {m}: {err}" for r in rows
               for m, e in r["modes"].items() for err in e["errors"]]
    if errors:
        lines += ["", "Runs that failed:"] + errors
    with open(stem + ".md", "w") as f:
        f.write("\n".join(lines) + "\n")
    return lines


if __name__ == "__main__":
    main()
