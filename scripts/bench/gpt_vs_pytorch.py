#!/usr/bin/env python3
"""CPU benchmark: dtrain's `model.type: gpt` on `data.dataset: bytes` against the same GPT in
PyTorch (torch_gpt.py: nanoGPT's layout, dtrain's data pipeline and recipe), eager and
torch.compile.

All runs use the same corpus, model, batch, optimizer, LR rule, steps and threads (2 by default).
One invocation runs --repeats rounds; each round runs dtrain, PyTorch eager and PyTorch compile
back to back (interleaved, the order rotated each round) so that noise on the machine hits all
alike. Throughput is tokens/s of training (block_size next-byte predictions per window; the
epoch's training time only, evaluation excluded). A run's steady-state figure is the median of
its epochs after the first (warm-up, compilation: the first epoch is reported apart); a table
figure is the median over rounds, and a ratio (dtrain tokens/s / peer tokens/s) the median of
the per-round ratios. Validation losses (nats per byte, the mean over every position of every
validation window) are after the same number of training tokens in each program, the first
round's (both programs are seeded).

The dtrain binary is copied once at the start, so a rebuild of build/ during the benchmark does
not change the program measured.

Usage: gpt_vs_pytorch.py --dtrain build/apps/dtrain --out results/bench [--epochs 3]
       [--train-limit 384] [--repeats 2] [--n-embd 256] [--block 128] ...
"""
import argparse
import csv
import hashlib
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
CONFIG = os.path.join(ROOT, "configs", "bytes-gpt.yaml")
# configs/bytes-gpt.yaml's recipe, which torch_gpt.py's defaults repeat: AdamW lr 1e-3 (no
# scaling: base batch = batch), betas 0.9/0.95, eps 1e-8, weight decay 0.1 on 2-D weights only,
# 0.5 warmup epochs (flat at the base batch), cosine to 0, gradient clip 1.0, seed 1.
RECIPE = ("AdamW lr 1e-3, betas 0.9/0.95, eps 1e-8, weight decay 0.1 on embeddings and dense "
          "weights only, 0.5 warmup epochs then cosine to 0 (dtrain's schedule, per step), "
          "gradient clipped to norm 1.0, dropout 0, seed 1")


def steady(values):
    """The median of the epochs after the first; the only epoch where there is one."""
    return statistics.median(values[1:]) if len(values) > 1 else values[0]


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def mem_gib():
    try:
        with open("/proc/meminfo") as f:
            kb = int(next(l for l in f if l.startswith("MemTotal")).split()[1])
        return round(kb / 2**20, 1)
    except (OSError, StopIteration, ValueError):
        return None


def dtrain_overrides(args):
    # The whole folder, as torch_gpt.py reads it: no files left out, no pinned sum.
    return ["backend=cpu", "gpus=1", f"threads={args.threads}", f"data.path={args.data}",
            "data.exclude=[]", "data.sha256=''",
            f"data.block_size={args.block}", f"data.train_limit={args.train_limit}",
            f"model.n_layer={args.n_layer}", f"model.n_head={args.n_head}",
            f"model.n_embd={args.n_embd}", f"train.per_replica_batch={args.batch}",
            f"optimizer.base_batch={args.batch}", f"train.epochs={args.epochs}"]


def torch_args(args, mode):
    return [f"--data={args.data}", f"--block={args.block}", f"--train-limit={args.train_limit}",
            f"--n-layer={args.n_layer}", f"--n-head={args.n_head}", f"--n-embd={args.n_embd}",
            f"--batch={args.batch}", f"--epochs={args.epochs}", f"--threads={args.threads}",
            f"--mode={mode}"]


def run_dtrain(binary, args, results, rep, seed=None):
    tag = f"bench-gpt-r{rep}" + (f"-s{seed}" if seed is not None else "")
    cmd = [binary, "run", CONFIG, *dtrain_overrides(args),
           *([f"train.seed={seed}"] if seed is not None else []), "--results", results, "--tag",
           tag, "--quiet"]
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wall = time.perf_counter() - t0
    run_dir = os.path.join(results, "bytes-gpt", f"{tag}-g1")
    with open(os.path.join(run_dir, "summary.json")) as f:
        s = json.load(f)
    with open(os.path.join(run_dir, "metrics.csv")) as f:
        rows = list(csv.DictReader(f))
    epochs = []
    for r in rows:
        t, n = float(r["epoch_time_s"]), float(r["samples"])
        epochs.append(dict(epoch=int(r["epoch"]), epoch_time_s=t,
                           tokens_per_s=n * args.block / t, train_loss=float(r["train_loss"]),
                           test_loss=float(r["test_loss"]), samples=int(n),
                           data_s=float(r["data_s"]), compute_s=float(r["compute_s"]),
                           optimizer_s=float(r["optimizer_s"]), eval_s=float(r["eval_s"])))
    tps = [e["tokens_per_s"] for e in epochs]
    return dict(framework="dtrain", mode="cpu", status=s.get("status", "?"),
                blas=s.get("blas", "?"), devices=s.get("devices", "?"), params=s.get("parameters", s.get("param_count")),
                steady_tokens_per_s=steady(tps), first_tokens_per_s=tps[0],
                first_epoch_time_s=epochs[0]["epoch_time_s"],
                steady_epoch_time_s=steady([e["epoch_time_s"] for e in epochs]),
                final_train_loss=epochs[-1]["train_loss"],
                final_test_loss=epochs[-1]["test_loss"],
                tokens_per_epoch=epochs[-1]["samples"] * args.block, wall_s=wall,
                epochs=epochs)


def run_torch(args, mode, seed=None):
    cmd = [sys.executable, os.path.join(HERE, "torch_gpt.py"), *torch_args(args, mode),
           *([f"--seed={seed}"] if seed is not None else [])]
    t0 = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        raise RuntimeError(f"torch_gpt.py --mode {mode} failed:\n{p.stderr[-3000:]}")
    line = next(l for l in p.stdout.splitlines() if l.startswith("SUMMARY "))
    s = json.loads(line[len("SUMMARY "):])
    s["wall_s"] = wall
    return s


def cpu_jiffies():
    """(busy, total) jiffies of the whole machine, from /proc/stat."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    idle = v[3] + (v[4] if len(v) > 4 else 0)  # idle + iowait
    total = sum(v[:8])
    return total - idle, total


class Foreign:
    """Measures the CPU the rest of the machine used while a run ran: machine busy time minus
    the run's own (children's user + system time), in cores on average."""

    def __enter__(self):
        self.busy0, self.total0 = cpu_jiffies()
        r = resource.getrusage(resource.RUSAGE_CHILDREN)
        self.own0 = r.ru_utime + r.ru_stime
        self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc):
        busy, total = cpu_jiffies()
        r = resource.getrusage(resource.RUSAGE_CHILDREN)
        hz = os.sysconf("SC_CLK_TCK")
        wall = time.perf_counter() - self.t0
        self.own_cores = (r.ru_utime + r.ru_stime - self.own0) / wall
        self.foreign_cores = max(0.0, (busy - self.busy0) / hz / wall - self.own_cores)
        return False


def wait_idle(limit_s, threshold=0.3, window_s=5.0):
    """Waits (at most limit_s) until the machine's other work uses under `threshold` cores over
    `window_s`; returns the seconds waited and the last measured load, in cores."""
    t0 = time.perf_counter()
    hz = os.sysconf("SC_CLK_TCK")
    while True:
        b0, _ = cpu_jiffies()
        time.sleep(window_s)
        b1, _ = cpu_jiffies()
        cores = (b1 - b0) / hz / window_s
        waited = time.perf_counter() - t0
        if cores < threshold or waited >= limit_s:
            return waited, cores


def loadavg():
    try:
        return os.getloadavg()[0]
    except OSError:
        return float("nan")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtrain", default=os.path.join(ROOT, "build", "apps", "dtrain"))
    ap.add_argument("--out", default=os.path.join(ROOT, "results", "bench"))
    ap.add_argument("--data", default="/usr/share/common-licenses")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--train-limit", type=int, default=384,
                    help="training windows per epoch (data.train_limit; 0: all)")
    ap.add_argument("--n-layer", type=int, default=4)
    ap.add_argument("--n-head", type=int, default=4)
    ap.add_argument("--n-embd", type=int, default=256)
    ap.add_argument("--block", type=int, default=128)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--modes", default="eager,compile", help="PyTorch modes, comma-separated")
    ap.add_argument("--seeds", default="",
                    help="extra seeds (comma-separated) run after the timed rounds, dtrain and "
                         "PyTorch eager only, for the seed-to-seed spread of the validation loss")
    ap.add_argument("--render", metavar="JSON",
                    help="only rebuild the markdown file from this json (no runs)")
    ap.add_argument("--wait-idle", type=float, default=0, metavar="S",
                    help="before each run wait up to S seconds for the machine's other work to "
                         "fall under 0.3 cores (0: do not wait)")
    ap.add_argument("--note", action="append", default=[],
                    help="with --render: a paragraph for the file's Notes (repeatable; stored "
                         "in the json's meta.notes, replacing earlier notes)")
    ap.add_argument("--stem", default="gpt-vs-pytorch", help="output file name, no extension")
    args = ap.parse_args()
    if args.render:
        with open(args.render) as f:
            j = json.load(f)
        if args.note:
            j["meta"]["notes"] = args.note
            with open(args.render, "w") as f:
                json.dump(j, f, indent=2)
        render(j["meta"], j["rows"], j["runs"], os.path.splitext(args.render)[0] + ".md",
               j.get("seed_runs"))
        return
    cache = os.environ.get("TORCHINDUCTOR_CACHE_DIR") or os.path.join(
        tempfile.gettempdir(), "torchinductor_" + os.environ.get("USER", "root"))
    inductor_cache_warm = os.path.isdir(cache) and bool(os.listdir(cache))
    modes = [m for m in args.modes.split(",") if m]
    os.makedirs(args.out, exist_ok=True)
    scratch = tempfile.mkdtemp(prefix="dtrain-gpt-bench-")
    binary = os.path.join(scratch, "dtrain")
    shutil.copy2(args.dtrain, binary)
    with open(binary, "rb") as f:
        binary_sha = hashlib.sha256(f.read()).hexdigest()[:16]
    binary_mtime = time.strftime("%Y-%m-%d %H:%M UTC",
                                 time.gmtime(os.path.getmtime(args.dtrain)))
    contenders = ["dtrain"] + [f"pytorch-{m}" for m in modes]
    runs = {c: [] for c in contenders}
    loads = []
    t_start = time.perf_counter()
    try:
        for rep in range(args.repeats):
            order = contenders[rep % len(contenders):] + contenders[:rep % len(contenders)]
            print(f"round {rep + 1}/{args.repeats}: {' -> '.join(order)}", flush=True)
            for c in order:
                waited, idle_cores = (wait_idle(args.wait_idle) if args.wait_idle > 0
                                      else (0.0, None))
                loads.append(loadavg())
                with Foreign() as fl:
                    if c == "dtrain":
                        r = run_dtrain(binary, args, scratch, rep)
                    else:
                        r = run_torch(args, c[len("pytorch-"):])
                loads.append(loadavg())
                r.update(foreign_cores=fl.foreign_cores, own_cores=fl.own_cores,
                         waited_idle_s=waited, load_before_cores=idle_cores)
                runs[c].append(r)
                extra = (f", warm-up/compile {r['warmup_s']:.1f} s" if "warmup_s" in r else "")
                print(f"  {c}: steady {r['steady_tokens_per_s']:.0f} tok/s, first epoch "
                      f"{r['first_tokens_per_s']:.0f} tok/s{extra}, val loss "
                      f"{r['final_test_loss']:.4f} (wall {r['wall_s']:.0f} s, other work "
                      f"{fl.foreign_cores:.2f} cores)", flush=True)
        # Seed spread (untimed for the table): the same runs with other seeds.
        seed_runs = {"dtrain": [], "pytorch-eager": []}
        for seed in [int(v) for v in args.seeds.split(",") if v]:
            for c in seed_runs:
                r = (run_dtrain(binary, args, scratch, "seed", seed) if c == "dtrain" else
                     run_torch(args, "eager", seed))
                seed_runs[c].append(dict(seed=seed, final_test_loss=r["final_test_loss"],
                                         steady_tokens_per_s=r["steady_tokens_per_s"]))
                print(f"  seed {seed} {c}: val loss {r['final_test_loss']:.4f}", flush=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    total_s = time.perf_counter() - t_start

    d_runs = runs["dtrain"]
    rows = []
    for c in contenders:
        rs = runs[c]
        row = dict(contender=c,
                   foreign_cores_all=[r.get("foreign_cores") for r in rs],
                   steady_tokens_per_s=statistics.median(r["steady_tokens_per_s"] for r in rs),
                   steady_tokens_per_s_all=[r["steady_tokens_per_s"] for r in rs],
                   first_epoch_tokens_per_s=statistics.median(r["first_tokens_per_s"]
                                                              for r in rs),
                   final_test_loss=rs[0]["final_test_loss"],
                   final_test_loss_all=[r["final_test_loss"] for r in rs],
                   final_train_loss=rs[0]["final_train_loss"])
        if "warmup_s" in rs[0]:
            row["warmup_s"] = statistics.median(r["warmup_s"] for r in rs)
            row["compile_error"] = rs[0].get("compile_error")
            row["mode_run"] = rs[0].get("mode")
            row["optimizer_impl"] = rs[0].get("optimizer_impl")
        if c != "dtrain":
            ratios = [d["steady_tokens_per_s"] / r["steady_tokens_per_s"]
                      for d, r in zip(d_runs, rs)]
            row.update(ratio=statistics.median(ratios), ratio_min=min(ratios),
                       ratio_max=max(ratios),
                       loss_delta=d_runs[0]["final_test_loss"] - rs[0]["final_test_loss"])
            row["speed_target_met"] = row["ratio"] >= 1.5
            row["loss_target_met"] = abs(row["loss_delta"]) <= 0.02
        rows.append(row)

    sha = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short=12", "HEAD"],
                         capture_output=True, text=True).stdout.strip()
    if subprocess.run(["git", "-C", ROOT, "diff", "--quiet", "HEAD"]).returncode != 0:
        sha += "-dirty"
    t0 = next((r for c in contenders[1:] for r in runs[c]), {})
    tokens_epoch = d_runs[0]["tokens_per_epoch"]
    meta = dict(date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), commit=sha,
                dtrain_binary=args.dtrain, dtrain_binary_built=binary_mtime,
                dtrain_binary_sha256_16=binary_sha,
                cpu=cpu_model(), arch=platform.machine(), cores=os.cpu_count(),
                memory_gib=mem_gib(), threads=args.threads, torch=t0.get("torch", "?"),
                python=platform.python_version(), dtrain_blas=d_runs[0]["blas"],
                dtrain_devices=d_runs[0].get("devices", "?"),
                openblas_coretype=os.environ.get("OPENBLAS_CORETYPE", "(unset)"),
                data=args.data, n_layer=args.n_layer, n_head=args.n_head, n_embd=args.n_embd,
                block=args.block, batch=args.batch, epochs=args.epochs,
                train_limit=args.train_limit, steps_per_epoch=tokens_epoch // (args.batch *
                                                                               args.block),
                tokens_per_epoch=tokens_epoch, tokens_per_run=tokens_epoch * args.epochs,
                params_pytorch=t0.get("params"), repeats=args.repeats, recipe=RECIPE,
                load_avg_1min=dict(min=min(loads), max=max(loads),
                                   median=statistics.median(loads)),
                total_wall_s=total_s, inductor_cache=cache, seeds=args.seeds,
                wait_idle_s=args.wait_idle,
                inductor_cache_warm=inductor_cache_warm)
    if any(seed_runs.values()):
        for c in seed_runs:  # seed 1 is round 1's run
            seed_runs[c].insert(0, dict(seed=1, final_test_loss=runs[c][0]["final_test_loss"],
                                        steady_tokens_per_s=runs[c][0]["steady_tokens_per_s"]))
    else:
        seed_runs = None
    with open(os.path.join(args.out, args.stem + ".json"), "w") as f:
        json.dump(dict(meta=meta, rows=rows, runs=runs, seed_runs=seed_runs), f, indent=2)

    render(meta, rows, runs, os.path.join(args.out, args.stem + ".md"), seed_runs)


QUIET_CORES = 0.25  # a run during which other work used more than this is not steady state


def clean_ratios(d_row, p_row):
    """The per-round ratios of the rounds where neither run shared the machine (other work
    under QUIET_CORES cores), or None where that was not measured."""
    df, pf = d_row.get("foreign_cores_all"), p_row.get("foreign_cores_all")
    if not df or not pf or None in df or None in pf:
        return None
    return [d / p for d, p, a, b in zip(d_row["steady_tokens_per_s_all"],
                                        p_row["steady_tokens_per_s_all"], df, pf)
            if a < QUIET_CORES and b < QUIET_CORES]


def render(m, rows, runs, md_path, seed_runs=None):
    """Writes the markdown table from the json's contents (--render rebuilds it)."""
    flags = (f"--epochs {m['epochs']} --train-limit {m['train_limit']} --repeats {m['repeats']}"
             f" --n-layer {m['n_layer']} --n-head {m['n_head']} --n-embd {m['n_embd']} "
             f"--block {m['block']} --batch {m['batch']} --threads {m['threads']}"
             + (f" --seeds {m['seeds']}" if m.get("seeds") else "")
             + (f" --wait-idle {m['wait_idle_s']:g}" if m.get("wait_idle_s") else ""))
    peer_modes = [r["contender"][len("pytorch-"):] for r in rows[1:]]
    if peer_modes != ["eager", "compile"]:
        flags += f" --modes {','.join(peer_modes)}"
    stem = os.path.splitext(os.path.basename(md_path))[0]
    if stem != "gpt-vs-pytorch":
        flags += f" --stem {stem}"
    lines = [
        "# dtrain against PyTorch on the CPU: a GPT on bytes",
        "",
        f"{m['date']}, commit {m['commit']} (dtrain binary built {m['dtrain_binary_built']}), {m['cpu']} "
        f"({m['arch']}), {m['cores']} cores, {m['memory_gib']} GiB, {m['threads']} "
        f"threads for each program, PyTorch {m['torch']} from PyPI (Python "
        f"{m['python']}). {m['repeats']} rounds; in each round dtrain, PyTorch eager and "
        "PyTorch torch.compile ran back to back, interleaved, the order rotated each round, so "
        "that load from other work on the machine (a C++ build ran alongside at times: 1-minute "
        f"load average {m['load_avg_1min']['min']:.1f} to {m['load_avg_1min']['max']:.1f}"
        f" at the runs' starts and ends, on {m['cores']} cores) hits all alike. The whole "
        f"benchmark took {m['total_wall_s'] / 60:.1f} minutes.",
        "",
        f"Model: GPT-2 layout, {m['n_layer']} layers, {m['n_head']} heads, width {m['n_embd']}, "
        f"context {m['block']}, vocabulary 256 (bytes), tied head, "
        f"{m['params_pytorch']:,} parameters. Data: `{m['data']}` as one byte stream "
        f"(configs/bytes-gpt.yaml, dtrain's data.dataset bytes; the PyTorch side reads the same "
        f"windows), the last 10% for validation; "
        + (f"data.train_limit {m['train_limit']} windows" if m['train_limit'] else
           "all training windows") + ", so "
        f"{m['steps_per_epoch']} steps of batch {m['batch']} = {m['tokens_per_epoch']:,} tokens per "
        f"epoch, {m['epochs']} epochs = {m['tokens_per_run']:,} training tokens per run. "
        f"Recipe (both): {RECIPE}. PyTorch: scripts/bench/torch_gpt.py (nanoGPT's model "
        f"in our own words, fused SDPA attention, {rows[1].get('optimizer_impl', '?')} AdamW, "
        "clip_grad_norm_); compile = torch.compile(model), default mode, Inductor's C++ "
        "backend, with the compilation in a warm-up forward/backward before the timed epochs "
        + {True: "(Inductor's on-disk cache was already warm, as on a user's second run: a "
                 "cold first compile took about a minute here)",
           False: "(Inductor's on-disk cache cold at the start: round 1 compiled from scratch)",
           None: ""}[m.get("inductor_cache_warm")] + ".",
        "",
        "Tokens/s: training tokens (block next-byte targets per window) over the epoch's "
        "training time (evaluation excluded). Steady = the median of a run's epochs after the "
        "first, then the median over rounds; the first epoch is reported apart. Ratio = dtrain "
        "tokens/s / peer tokens/s, the median of the per-round ratios (min-max). Validation "
        "loss: nats per byte, the mean over every position of all validation windows, after "
        f"the run's {m['tokens_per_run']:,} training tokens (round 1). Other work: the CPU the "
        "rest of the machine used during the run (machine busy time from /proc/stat minus the "
        f"run's own CPU time), in cores of the {m['cores']}; where it is well above 0 the "
        "programs competed for the cores and the figures are not steady state.",
        "",
        f"dtrain's devices: {m.get('dtrain_devices', '?')} (gemm: whose sgemm, "
        "DTRAIN_CPU_GEMM); its OpenBLAS, used where gemm is openblas: "
        f"{m['dtrain_blas']}; OPENBLAS_CORETYPE={m['openblas_coretype']}. "
        "PyTorch uses its bundled MKL/oneDNN.",
        "",
        "| program | steady tokens/s (per round) | other work, cores (per round) | first epoch tokens/s | warm-up / compile s | "
        "dtrain / peer (min-max) | val loss | dtrain - peer val loss |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        per = ", ".join(f"{v:.0f}" for v in r["steady_tokens_per_s_all"])
        warm = f"{r['warmup_s']:.1f}" if "warmup_s" in r else "-"
        ratio = (f"{r['ratio']:.2f}x ({r['ratio_min']:.2f}-{r['ratio_max']:.2f})"
                 if "ratio" in r else "-")
        delta = f"{r['loss_delta']:+.4f}" if "loss_delta" in r else "-"
        name = r["contender"]
        if r.get("compile_error"):
            name += f" (compile failed, ran eager: {r['compile_error']})"
        fc = r.get("foreign_cores_all") or []
        fcs = ", ".join("?" if v is None else f"{v:.2f}" for v in fc) or "-"
        lines.append(f"| {name} | {r['steady_tokens_per_s']:.0f} ({per}) | {fcs} | "
                     f"{r['first_epoch_tokens_per_s']:.0f} | {warm} | {ratio} | "
                     f"{r['final_test_loss']:.4f} | {delta} |")
    lines += ["", "Targets (dtrain >= 1.5x the peer's tokens/s; validation loss within 0.02 "
              "nats):"]
    for r in rows[1:]:
        clean = clean_ratios(rows[0], r)
        if clean:
            cr = statistics.median(clean)
            speed = (f"speed {'met' if cr >= 1.5 else 'NOT met'}: {cr:.2f}x, the median over "
                     f"the {len(clean)} round(s) where neither run shared the machine (other "
                     f"work < {QUIET_CORES} cores; all rounds: {r['ratio']:.2f}x)")
        elif clean == []:
            speed = (f"speed not judged: no round ran on a quiet machine (all rounds, under "
                     f"load: {r['ratio']:.2f}x)")
        else:
            speed = f"speed {'met' if r['speed_target_met'] else 'NOT met'} ({r['ratio']:.2f}x)"
        lines.append(f"- against {r['contender']}: {speed}; loss (seed 1) "
                     f"{'met' if r['loss_target_met'] else 'NOT met'} ({r['loss_delta']:+.4f} "
                     "nats" + ("; see the seeds below)" if seed_runs else ")"))
    if seed_runs:
        lines += ["", "Validation loss over seeds (the same runs, untimed here, seed 1 being "
                  "round 1):"]
        for c, rs in seed_runs.items():
            v = [r["final_test_loss"] for r in rs]
            lines.append(f"- {c}: " + ", ".join(f"seed {r['seed']} {r['final_test_loss']:.4f}"
                                                  for r in rs)
                         + f"; mean {statistics.mean(v):.4f}, range {max(v) - min(v):.4f}")
        md = [statistics.mean(r["final_test_loss"] for r in seed_runs["dtrain"]),
              statistics.mean(r["final_test_loss"] for r in seed_runs["pytorch-eager"])]
        spread = max(max(r["final_test_loss"] for r in rs) - min(r["final_test_loss"] for r in rs)
                     for rs in seed_runs.values())
        n = len(seed_runs["dtrain"])
        lines.append(f"- mean over the {n} seeds, dtrain - PyTorch: {md[0] - md[1]:+.4f} nats "
                     f"({'within' if abs(md[0] - md[1]) <= 0.02 else 'outside'} 0.02); the "
                     f"seed-to-seed range within one program is up to {spread:.3f} nats, so at "
                     f"this token budget a single-seed difference "
                     f"{'cannot resolve' if spread > 0.04 else 'can resolve'} 0.02 nats")
    dphase = runs['dtrain'][0]["epochs"][-1]
    lines += ["", f"dtrain's phases in its last epoch of round 1 (metrics.csv): compute "
              f"{dphase['compute_s']:.1f} s, optimizer {dphase['optimizer_s']:.1f} s, data "
              f"{dphase['data_s']:.3f} s of {dphase['epoch_time_s']:.1f} s (evaluation, "
              f"untimed, {dphase['eval_s']:.1f} s).",
              "", f"Reproduce: `scripts/bench-gpt-vs-pytorch.sh {flags}`", ""]
    if m.get("notes"):
        lines += ["## Notes", ""]
        for n in m["notes"]:
            lines += [n, ""]
    with open(md_path, "w") as f:
        f.write("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
