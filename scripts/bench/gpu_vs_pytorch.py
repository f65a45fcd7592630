#!/usr/bin/env python3
"""GPU benchmark: dtrain's CUDA backend against eager PyTorch on the same GPU, the quickstart MLP
on Fashion-MNIST with the data already on the GPU, at batch 128 and 1024, alternating repeats in
one invocation. dtrain runs twice per repeat: with its step in a CUDA graph (the default) and
with train.cuda_graph=false (kernels launched one by one, as PyTorch eager does). Also states each dtrain step against its floor: the larger of
  launches per step x the measured launch latency, and
  the step's GEMM FLOPs / the measured cuBLAS SGEMM throughput (fp32 or tf32),
both measured on the same GPU by `dtrain devices --measure --json`.

Usage: gpu_vs_pytorch.py --dtrain build/apps/dtrain --out DIR [--epochs 5] [--repeats 3]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
CASES = [(128, "linear"), (1024, "sqrt")]
LAYERS = [784, 256, 128, 10]  # the quickstart MLP


def gemm_flops_per_sample():
    # Forward x W, backward dW = x^T dy and dx = dy W^T (not for the first layer's input).
    f = 0
    for i, (a, b) in enumerate(zip(LAYERS, LAYERS[1:])):
        f += 2 * a * b * (2 if i == 0 else 3)
    return f


def run_dtrain(binary, data, batch, scaling, epochs, precision, results, tag, graph=True):
    cmd = [binary, "run", os.path.join(ROOT, "configs", "quickstart.yaml"), "backend=cuda",
           f"data.path={data}", f"precision={precision}", f"train.per_replica_batch={batch}",
           f"train.cuda_graph={'true' if graph else 'false'}",
           f"optimizer.lr_scaling={scaling}", f"train.epochs={epochs}", "--results", results,
           "--tag", tag, "--quiet"]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    with open(os.path.join(results, "fmnist-mlp", f"{tag}-g1", "summary.json")) as f:
        return json.load(f)


def run_torch(python, data, batch, scaling, epochs):
    cmd = [python, os.path.join(HERE, "torch_mlp.py"), "--device=cuda", f"--batch={batch}",
           f"--epochs={epochs}", f"--scaling={scaling}", "--threads=1", f"--data={data}"]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    line = next(l for l in out.splitlines() if l.startswith("SUMMARY "))
    return json.loads(line[len("SUMMARY "):])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtrain", default=os.path.join(ROOT, "build", "apps", "dtrain"))
    ap.add_argument("--python", default=sys.executable, help="a python with torch (CUDA)")
    ap.add_argument("--out", default=os.path.join(ROOT, "results", "gpu"))
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--data", default="/usr/share/datasets/fashion-mnist",
                    help="folder with the four Fashion-MNIST IDX files")
    ap.add_argument("--precision", default="fp32", choices=["fp32", "tf32"])
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    dev = json.loads(subprocess.run([args.dtrain, "devices", "--measure", "--json"], check=True,
                                    capture_output=True, text=True).stdout)
    if not dev["gpus"]:
        sys.exit(f"gpu_vs_pytorch: no GPU ({dev['no_gpu_reason']})")
    gpu = dev["gpus"][0]
    peak = gpu["sgemm_tf32_tflops" if args.precision == "tf32" else "sgemm_fp32_tflops"] * 1e12
    scratch = tempfile.mkdtemp(prefix="dtrain-gpu-bench-")
    rows = []
    for batch, scaling in CASES:
        d_t, e_t, t_t, ratios, d_sum, t_sum = [], [], [], [], None, None
        for rep in range(args.repeats):
            common = (args.dtrain, args.data, batch, scaling, args.epochs, args.precision, scratch)
            ds = run_dtrain(*common, f"b{batch}-r{rep}")
            es = run_dtrain(*common, f"b{batch}-r{rep}-eager", graph=False)
            ts = run_torch(args.python, args.data, batch, scaling, args.epochs)
            d_t.append(ds["median_epoch_time_s"])
            e_t.append(es["median_epoch_time_s"])
            t_t.append(ts["median_epoch_time_s"])
            ratios.append(ts["median_epoch_time_s"] / ds["median_epoch_time_s"])
            d_sum, t_sum = d_sum or ds, t_sum or ts
            print(f"batch {batch} repeat {rep + 1}: dtrain {d_t[-1]:.3f} s/epoch "
                  f"(eager {e_t[-1]:.3f}, graph steps {ds.get('cuda_graph_steps', 0)}), "
                  f"pytorch {t_t[-1]:.3f} s/epoch, {ratios[-1]:.2f}x", flush=True)
        steps = d_sum["steps_per_epoch"]
        step_s = statistics.median(d_t) / steps
        launch_floor = d_sum.get("launches_per_step", 0) * gpu["launch_us"] * 1e-6
        flop_floor = gemm_flops_per_sample() * batch / peak
        floor = max(launch_floor, flop_floor)
        rows.append(dict(batch=batch, scaling=scaling, dtrain_epoch_s=statistics.median(d_t),
                         dtrain_eager_epoch_s=statistics.median(e_t),
                         cuda_graph=d_sum.get("cuda_graph", "?"),
                         torch_epoch_s=statistics.median(t_t),
                         speedup=statistics.median(ratios), speedup_min=min(ratios),
                         speedup_max=max(ratios),
                         dtrain_acc=d_sum["final_test_accuracy"],
                         torch_acc=t_sum["final_test_acc"], step_us=step_s * 1e6,
                         launches_per_step=d_sum.get("launches_per_step", 0),
                         launch_floor_us=launch_floor * 1e6, flop_floor_us=flop_floor * 1e6,
                         step_over_floor=step_s / floor if floor > 0 else None))
    meta = dict(date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), gpu=gpu,
                driver=dev["driver"], cuda=dev["cuda_runtime"], precision=args.precision,
                epochs=args.epochs, repeats=args.repeats, torch=t_sum.get("torch"))
    with open(os.path.join(args.out, "gpu-mlp-vs-pytorch.json"), "w") as f:
        json.dump(dict(meta=meta, rows=rows), f, indent=2)
    lines = [f"# dtrain CUDA backend against eager PyTorch on {gpu['name']}", "",
             f"{meta['date']}, driver {meta['driver']}, CUDA {meta['cuda']}, torch "
             f"{meta['torch']}, precision {args.precision}, {args.epochs} epochs x "
             f"{args.repeats} alternating repeats. Launch latency {gpu['launch_us']:.2f} us, "
             f"cuBLAS SGEMM {peak / 1e12:.1f} TFLOP/s.", "",
             "| batch | dtrain s/epoch | dtrain eager s/epoch | PyTorch s/epoch | speedup (min-max) "
             "| dtrain acc | PyTorch acc | step us | launches/step | launch floor us | "
             "FLOP floor us | step / floor |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['batch']} | {r['dtrain_epoch_s']:.3f} | "
                     f"{r['dtrain_eager_epoch_s']:.3f} | {r['torch_epoch_s']:.3f} | "
                     f"{r['speedup']:.2f}x ({r['speedup_min']:.2f}-{r['speedup_max']:.2f}) | "
                     f"{100 * r['dtrain_acc']:.2f}% | {100 * r['torch_acc']:.2f}% | "
                     f"{r['step_us']:.1f} | {r['launches_per_step']} | "
                     f"{r['launch_floor_us']:.1f} | {r['flop_floor_us']:.1f} | "
                     f"{r['step_over_floor']:.2f} |")
    lines += ["", f"CUDA graphs: {rows[0]['cuda_graph']}. Speedup: PyTorch eager s/epoch over "
              "dtrain's (graph) s/epoch, median of the repeats."]
    with open(os.path.join(args.out, "gpu-mlp-vs-pytorch.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
