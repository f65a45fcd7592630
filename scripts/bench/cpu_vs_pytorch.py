#!/usr/bin/env python3
"""Side-by-side CPU benchmark: dtrain against PyTorch on the quickstart MLP, the small CNN, the
Fashion-MNIST ResNet or ResNet-20 on synthetic 3x32x32 (--model).

At 1 replica dtrain runs against plain PyTorch; at N replicas against PyTorch DDP (gloo) in N
processes. Both use the same data (preloaded in memory), model, optimizer, LR rule, epochs and
total thread count. For the CNN, dtrain runs once with each CPU convolution implementation
(oneDNN and im2col + OpenBLAS), both against the same PyTorch runs. Each pair runs back to
back, alternating, --repeats times in one invocation. A time is the steady-state epoch time
(training only, evaluation excluded: the median of the epochs after the first, where warm-up
and torch.compile's compilation fall) of each repeat, the median over repeats; the speedup is
the median of the per-repeat ratios, and accuracies are those of the first repeat (both
programs are seeded).

Usage: cpu_vs_pytorch.py --dtrain build/apps/dtrain --out results/bench [--epochs 10]
"""
import argparse
import csv
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))

# (replicas, per-replica batch, LR scaling rule). Linear scaling to batch 1024 and beyond is
# unstable for this recipe in both frameworks (see docs/performance.md), so the large batch uses
# sqrt.
# At 4 replicas the large case is global batch 1024 (256 per replica).
CASES = [(1, 64, "linear"), (1, 1024, "sqrt"), (4, 64, "linear"), (4, 256, "sqrt")]


# The recipes, as the two programs spell them. "dtrain" holds overrides on the config; "torch"
# the peer's arguments (torch_mlp.py) for the same model, data and optimizer.
RESNET_TORCH = ["--model=resnet", "--lr=0.1", "--base-batch=128", "--warmup=1"]
MODELS = {
    "mlp": dict(config="quickstart.yaml", experiment="fmnist-mlp", cases=CASES, dtrain=[],
                torch=["--model=mlp"], title="Fashion-MNIST MLP",
                recipe="SGD momentum 0.9, lr 0.05 at batch 64, weight decay 5e-4, 2 warmup "
                       "epochs, cosine"),
    "cnn": dict(config="fmnist-cnn.yaml", experiment="fmnist-cnn", cases=[(1, 64, "linear")],
                dtrain=[], torch=["--model=cnn"], title="Fashion-MNIST CNN",
                recipe="SGD momentum 0.9, lr 0.05 at batch 64, weight decay 5e-4, 2 warmup "
                       "epochs, cosine"),
    # configs/fmnist-resnet.yaml as it is (ResNet-20, widths 16/32/64) on Fashion-MNIST, flips
    # and crops off in both programs (the peer's data path has no augmentation: the step is
    # what is compared).
    "resnet": dict(config="fmnist-resnet.yaml", experiment="fmnist-resnet",
                   cases=[(1, 128, "linear")],
                   dtrain=["data.augment.flip=false", "data.augment.crop_padding=0"],
                   torch=RESNET_TORCH + ["--depth=20", "--widths=16,32,64"],
                   title="Fashion-MNIST ResNet (configs/fmnist-resnet.yaml: ResNet-20, widths "
                         "16/32/64)",
                   recipe="SGD momentum 0.9, lr 0.1 at batch 128, weight decay 5e-4, 1 warmup "
                          "epoch, cosine"),
    # The CIFAR ResNet-20 (widths 16/32/64) on synthetic 3x32x32 inputs, 10,240 per epoch.
    "resnet20": dict(config="fmnist-resnet.yaml", experiment="fmnist-resnet",
                     cases=[(1, 128, "linear")],
                     dtrain=["data.augment.flip=false", "data.augment.crop_padding=0",
                             "data.dataset=synthetic",
                             "data.synthetic.shape=[3,32,32]", "data.synthetic.train_size=10240",
                             "data.synthetic.test_size=1024", "model.widths=[16,32,64]"],
                     torch=RESNET_TORCH + ["--depth=20", "--widths=16,32,64",
                                           "--synthetic=3,32,32", "--train-size=10240",
                                           "--test-size=1024"],
                     title="ResNet-20 (widths 16/32/64) on synthetic 3x32x32",
                     # Each program draws its own random data: accuracies do not compare.
                     accuracy=False,
                     recipe="SGD momentum 0.9, lr 0.1 at batch 128, weight decay 5e-4, 1 warmup "
                            "epoch, cosine; 10,240 random samples per epoch"),
}
# dtrain's CPU convolution implementations, each measured against the same PyTorch runs.
CONVS = {"mlp": [None], "cnn": ["onednn", "im2col"], "resnet": ["onednn"], "resnet20": ["onednn"]}


def steady(times):
    """Steady state: the median epoch time after the first (warm-up, compilation), as both
    programs are timed; the first epoch alone where there is one."""
    return statistics.median(times[1:]) if len(times) > 1 else times[0]


def run_dtrain(binary, model, replicas, batch, scaling, epochs, threads, results, rep, conv):
    config, experiment = MODELS[model]["config"], MODELS[model]["experiment"]
    tag = f"bench-{replicas}x{batch}-{conv or 'default'}-r{rep}"
    env = dict(os.environ)
    if conv:
        env["DTRAIN_CPU_CONV"] = conv
    cmd = [binary, "run", os.path.join(ROOT, "configs", config), f"gpus={replicas}",
           f"train.per_replica_batch={batch}", f"optimizer.lr_scaling={scaling}",
           f"train.epochs={epochs}", f"threads={threads}", *MODELS[model]["dtrain"],
           "--results", results, "--tag", tag, "--quiet"]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, env=env)
    run_dir = os.path.join(results, experiment, f"{tag}-g{replicas}")
    with open(os.path.join(run_dir, "summary.json")) as f:
        s = json.load(f)
    with open(os.path.join(run_dir, "metrics.csv")) as f:
        times = [float(r["epoch_time_s"]) for r in csv.DictReader(f)]
    return steady(times), s["final_test_accuracy"], s["status"], s.get("blas", "?")


def run_torch(model, replicas, batch, scaling, epochs, threads, mode):
    cmd = [sys.executable, os.path.join(HERE, "torch_mlp.py"), *MODELS[model]["torch"],
           f"--batch={batch}", f"--epochs={epochs}", f"--threads={threads}", f"--ddp={replicas}",
           f"--scaling={scaling}", f"--mode={mode}"]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    line = next(l for l in out.splitlines() if l.startswith("SUMMARY "))
    s = json.loads(line[len("SUMMARY "):])
    return s["steady_epoch_time_s"], s["final_test_acc"], s["framework"], s["torch"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtrain", default=os.path.join(ROOT, "build", "apps", "dtrain"))
    ap.add_argument("--out", default=os.path.join(ROOT, "results", "bench"))
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--model", choices=sorted(MODELS), default="mlp")
    ap.add_argument("--peer-mode", default="eager", choices=["eager", "channels-last", "compile"],
                    help="how PyTorch runs the step on the CPU (torch_mlp.py --mode)")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    scratch = tempfile.mkdtemp(prefix="dtrain-bench-")
    rows = []
    torch_version = "?"
    blas = "?"
    try:
        for replicas, batch, scaling in MODELS[args.model]["cases"]:
            print(f"case {replicas} replica(s) x batch {batch} ({scaling} scaling) ...",
                  flush=True)
            convs = CONVS[args.model]
            d_times = {c: [] for c in convs}
            ratios = {c: [] for c in convs}
            d_acc = {c: None for c in convs}
            t_times, t_acc = [], None
            for rep in range(args.repeats):
                tt, ta, peer, torch_version = run_torch(args.model, replicas, batch, scaling,
                                                        args.epochs, args.threads, args.peer_mode)
                t_times.append(tt)
                if t_acc is None:
                    t_acc = ta
                print(f"  repeat {rep + 1}: {peer} {tt:.3f} s/epoch {100*ta:.2f}%", flush=True)
                for c in convs:
                    dt, da, d_status, blas = run_dtrain(args.dtrain, args.model, replicas, batch,
                                                        scaling, args.epochs, args.threads,
                                                        scratch, rep, c)
                    d_times[c].append(dt)
                    ratios[c].append(tt / dt)
                    if d_acc[c] is None:
                        d_acc[c] = da
                    print(f"    dtrain{' conv ' + c if c else ''} {dt:.3f} s/epoch "
                          f"{100*da:.2f}% ({d_status})   ratio {tt/dt:.2f}x", flush=True)
            for c in convs:
                rows.append(dict(replicas=replicas, batch=batch, scaling=scaling, peer=peer,
                                 conv=c or "-",
                                 dtrain_epoch_s=statistics.median(d_times[c]),
                                 peer_epoch_s=statistics.median(t_times),
                                 speedup=statistics.median(ratios[c]),
                                 speedup_min=min(ratios[c]), speedup_max=max(ratios[c]),
                                 dtrain_acc=d_acc[c], peer_acc=t_acc,
                                 acc_delta_points=100 * (d_acc[c] - t_acc)))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)

    sha = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short=12", "HEAD"],
                         capture_output=True, text=True).stdout.strip()
    if subprocess.run(["git", "-C", ROOT, "diff", "--quiet", "HEAD"]).returncode != 0:
        sha += "-dirty"
    meta = dict(date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), commit=sha,
                cpu=platform.processor() or platform.machine(), cores=os.cpu_count(),
                threads=args.threads, epochs=args.epochs, torch=torch_version, dtrain_blas=blas,
                openblas_coretype=os.environ.get("OPENBLAS_CORETYPE", "(unset)"))
    stem = f"cpu-{args.model}-vs-pytorch" + ("" if args.peer_mode == "eager" else
                                              f"-{args.peer_mode}")
    with open(os.path.join(args.out, stem + ".json"), "w") as f:
        json.dump(dict(meta=meta, rows=rows), f, indent=2)
    lines = [
        f"# dtrain against PyTorch on the CPU: {MODELS[args.model]['title']}",
        "",
        f"{meta['date']}, commit {sha}, {meta['cores']} cores, {args.threads} threads in total, "
        f"PyTorch {torch_version} from PyPI, {args.epochs} epochs per run, {args.repeats} "
        f"alternating repeats per case. Recipe: configs/{MODELS[args.model]['config']} "
        f"{' '.join(MODELS[args.model]['dtrain'])} ({MODELS[args.model]['recipe']}); PyTorch "
        f"mode {args.peer_mode}. Times are steady-state epoch times, training only (the median "
        "of the epochs after the first, where warm-up and compilation fall), the median over "
        "repeats; speedup = peer time / dtrain time, the median of the per-repeat ratios.",
        "",
        f"dtrain's BLAS: {blas}; OPENBLAS_CORETYPE={meta['openblas_coretype']}. PyTorch uses "
        "its bundled MKL/oneDNN.",
        "",
        "| replicas | batch per replica | global batch | LR rule | dtrain conv | peer | "
        "dtrain s/epoch | peer s/epoch | speedup (min-max) | dtrain acc | peer acc | "
        "delta (pts) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    compare = MODELS[args.model].get("accuracy", True)
    for r in rows:
        acc = (f"{100*r['dtrain_acc']:.2f}% | {100*r['peer_acc']:.2f}% | "
               f"{r['acc_delta_points']:+.2f}" if compare else "- | - | -")
        lines.append(f"| {r['replicas']} | {r['batch']} | {r['replicas'] * r['batch']} | "
                     f"{r['scaling']} | {r['conv']} | {r['peer']} ({args.peer_mode}) | "
                     f"{r['dtrain_epoch_s']:.3f} | {r['peer_epoch_s']:.3f} | "
                     f"{r['speedup']:.2f}x ({r['speedup_min']:.2f}-{r['speedup_max']:.2f}) | "
                     f"{acc} |")
    lines += ["", f"Reproduce: `scripts/bench-cpu-vs-pytorch.sh --model {args.model} --epochs "
              f"{args.epochs} --repeats {args.repeats} --peer-mode {args.peer_mode}`", ""]
    with open(os.path.join(args.out, stem + ".md"), "w") as f:
        f.write("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
