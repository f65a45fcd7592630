#!/usr/bin/env bash
# On a GPU machine: probe it, build (or unpack the carried binaries), check that the CUDA backend
# and a GPU are really there, run the GPU tests, the benchmark against PyTorch and a few training
# runs. Each stage runs under `timeout` and fits in one 10-minute command, and writes its
# evidence as it goes, so a hang in a late stage keeps what the earlier ones found.
#
#   scripts/gpu-check.sh                  # every stage in order
#   scripts/gpu-check.sh build devices    # some stages (in separate calls, or several at once)
#
# Stages: probe, build, devices, tests, bench, profile, runs, sanitizer. Evidence goes to
# ${OUT:-results/gpu}/<date>-<gpu>/ (one folder per day and GPU, so stages run in separate calls
# share it): stages.md, a table with one row per stage run, and per stage its log and an archive
# of its files (<stage>.log, <stage>.tar.gz; with OUT set the unpacked folder is removed, so that
# a call brings back few files).
#
# DTRAIN_GPU_CHECK_REHEARSAL=1 rehearses on a machine without a GPU (the CI's fresh root with no
# -dev packages): every stage runs that can, and the stages that need a GPU check instead that
# nothing pretends to be one (the `[cuda]` tests must fail under DTRAIN_REQUIRE_GPU=1).
#
# Data: Fashion-MNIST from $DTRAIN_DATA, else /usr/share/datasets/fashion-mnist, else the copy
# that scripts/build-portable.sh packs into .gpu-carry/data/fashion-mnist.
# Exit code: 0 every stage asked for passed (or had nothing to do), 1 one failed, 2 a stage
# cannot start (no data, unknown stage), 3 no GPU (outside a rehearsal; the probe still runs).
#
# One call has DTRAIN_GPU_CHECK_BUDGET seconds (default 570, inside a 10-minute command) for all
# its stages: each stage's limit is cut to what is left, so the call ends, with its evidence
# archived, before the command's own limit.
set -uo pipefail
self=$(readlink -f "$0")
cd "$(dirname "$self")/.."
root=$(pwd)
rehearsal=${DTRAIN_GPU_CHECK_REHEARSAL:-0}
all_stages=(probe build devices tests bench profile runs sanitizer)
one_stage=""
if [ "${1:-}" = --stage ]; then one_stage=$2; set --; fi  # a child running one stage
[ $# -gt 0 ] && stages=("$@") || stages=("${all_stages[@]}")
for s in "${stages[@]}" $one_stage; do
  case " ${all_stages[*]} " in *" $s "*) ;; *)
    echo "gpu-check: unknown stage '$s' (valid: ${all_stages[*]})"; exit 2 ;;
  esac
done

gpu_name=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1 | tr -c 'A-Za-z0-9.\n-' '-')
has_gpu=0
nvidia-smi -L >/dev/null 2>&1 && has_gpu=1
dest=${DTRAIN_GPU_CHECK_DEST:-"${OUT:-results/gpu}/$(date -u +%Y%m%d)-${gpu_name:-nogpu}"}
sdir="$dest/${one_stage:-none}"  # a stage's own files
mkdir -p "$dest"
[ -f "$dest/stages.md" ] || printf '| stage | result | seconds | started (UTC) | commit |\n|---|---|---|---|---|\n' > "$dest/stages.md"
commit=$(git describe --always --dirty --abbrev=12 2>/dev/null || echo "no git; carried binaries from $(cat .gpu-carry/commit 2>/dev/null || echo unknown)")

no_gpu=0
if [ "$has_gpu" = 0 ] && [ "$rehearsal" != 1 ] && [ -z "$one_stage" ]; then
  echo "gpu-check: no GPU on this machine (nvidia-smi -L failed); nothing CUDA can run here, so"
  echo "           only the probe runs (DTRAIN_GPU_CHECK_REHEARSAL=1 rehearses the stages that"
  echo "           need no GPU)"
  stages=(probe)
  no_gpu=1
fi

# The CUDA libraries may live in PyTorch's wheels rather than in the toolkit, under versioned
# names only; make them findable by the binaries.
libdirs=()
for lib in libcudnn.so.9 libnccl.so.2 libcublas.so.13; do
  grep -q "$lib" <(ldconfig -p 2>/dev/null) && continue  # no pipe: grep -q would cut it
  d=""
  for c in /usr/local/cuda/lib64 /usr/local/cuda/lib \
           $(python3 -c 'import nvidia; print(" ".join(p + "/*/lib" for p in nvidia.__path__))' 2>/dev/null); do
    for f in $c/$lib; do [ -e "$f" ] && { d=$(dirname "$f"); break 2; }; done
  done
  [ -n "$d" ] || d=$(find / -xdev -name "$lib" -not -path '*/proc/*' 2>/dev/null | head -n 1 | xargs -r dirname)
  [ -n "$d" ] && case " ${libdirs[*]} " in *" $d "*) ;; *) libdirs+=("$d") ;; esac
done
for d in "${libdirs[@]}"; do LD_LIBRARY_PATH="$d${LD_LIBRARY_PATH:+:${LD_LIBRARY_PATH:-}}"; done
export LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}

# Which binaries the later stages use: recorded by the build stage, which may be another call.
route_file=build-gpu/.route
bin_dir() {
  local d
  d=$(cat "$route_file" 2>/dev/null || echo build-gpu)
  [ -x "$d/apps/dtrain" ] && { echo "$d"; return 0; }
  echo "gpu-check: no dtrain binary in $d: run the build stage first" >&2
  return 2
}

data_dir() {
  local d
  for d in "${DTRAIN_DATA:-}" /usr/share/datasets/fashion-mnist "$root/.gpu-carry/data/fashion-mnist"; do
    [ -n "$d" ] && [ -f "$d/train-images-idx3-ubyte.gz" -o -f "$d/train-images-idx3-ubyte" ] && { echo "$d"; return 0; }
  done
  return 1
}
need_data() {
  data=$(data_dir) && return 0
  echo "gpu-check: no Fashion-MNIST data: none of \$DTRAIN_DATA, /usr/share/datasets/fashion-mnist," \
       "$root/.gpu-carry/data/fashion-mnist has train-images-idx3-ubyte(.gz);" \
       "run scripts/build-portable.sh on a machine with dataset-fashion-mnist and carry .gpu-carry"
  return 2
}

# Appends data.path=$data (the carried Fashion-MNIST) to the overrides in the array named $1,
# unless they name data of their own.
add_data_path() {
  local -n o=$1
  case " ${o[*]}" in *" data.path="*) ;; *) o+=(data.path="$data") ;; esac
}

stage_probe() {
  set -x
  nvidia-smi
  nvcc --version || /usr/local/cuda/bin/nvcc --version
  ldd --version | head -n 1
  cmake --version | head -n 1
  ninja --version
  python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "nccl", torch.cuda.nccl.version(), "cudnn", torch.backends.cudnn.version())'
  ls /usr/local/cuda/lib64 | grep -E 'libcudnn.so|libnccl.so|libcublas.so' | head
  find / -xdev \( -name 'libnccl.so*' -o -name 'libcudnn.so*' -o -name 'nccl.h' -o -name 'cudnn.h' \
       -o -name 'yaml.h' -o -name 'CLI.hpp' -o -name 'cblas.h' -o -name 'dnnl.hpp' \) 2>/dev/null | head -n 40
  echo "LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}"
  set +x
  return 0
}

# Build here with the CUDA backend required, or else unpack the binaries carried from a
# development machine (scripts/build-portable.sh). A CPU-only build never passes.
stage_build() {
  local gen=()
  command -v ninja >/dev/null && gen=(-G Ninja) || echo "gpu-check: no ninja; Unix Makefiles"
  mkdir -p build-gpu
  if command -v cmake >/dev/null &&
     cmake -S . -B build-gpu "${gen[@]}" -DCMAKE_BUILD_TYPE=Release -DDTRAIN_REQUIRE_CUDA=ON \
       -DCMAKE_CUDA_ARCHITECTURES=90 &&
     # Bounded, so that the carried binaries can still be tried within the stage's limit.
     timeout 300 cmake --build build-gpu -j"$(nproc)"; then
    echo build-gpu > "$route_file"
    echo "gpu-check: built here"
    return 0
  fi
  echo "gpu-check: no native build here (above); trying the carried portable binaries"
  if [ ! -f .gpu-carry/dtrain-portable.tar.gz ]; then
    echo "gpu-check: .gpu-carry/dtrain-portable.tar.gz is missing: run scripts/build-portable.sh" \
         "on a development machine and carry .gpu-carry"
    return 1
  fi
  rm -rf build-carried && mkdir -p build-carried
  tar -C build-carried -xzf .gpu-carry/dtrain-portable.tar.gz || return 1
  echo build-carried > "$route_file"
  # Every shared library the binaries need must be on this machine.
  local missing
  # -r: also symbols the libraries found here lack (a cuDNN or NCCL older than the build's).
  missing=$(ldd -r build-carried/apps/dtrain build-carried/tests/dtrain_tests 2>&1 |
            grep -E 'not found|undefined symbol' | sort -u)
  if [ -n "$missing" ]; then
    echo "gpu-check: the carried binaries lack shared libraries here:"; echo "$missing"
    return 1
  fi
  ldd build-carried/apps/dtrain
  echo "gpu-check: using the carried portable binaries"
}

# dtrain must report the CUDA backend as built and (outside a rehearsal) see a GPU.
stage_devices() {
  local b json
  b=$(bin_dir) || return 2
  json=$("$b/apps/dtrain" devices --json) || { echo "gpu-check: dtrain devices failed"; return 1; }
  echo "$json" | tee "$sdir/devices.json"
  echo "$json" | grep -q '"cuda_built":true' ||
    { echo "gpu-check: this dtrain was built without the CUDA backend"; return 1; }
  if [ "$rehearsal" = 1 ]; then
    echo "gpu-check: rehearsal: CUDA built; no GPU expected here"
    return 0
  fi
  echo "$json" | grep -q '"gpus":\[\]' && { echo "gpu-check: dtrain sees no GPU"; return 1; }
  "$b/apps/dtrain" devices --measure
}

# The first failed assertions of a compact Catch2 report, with their messages, so that a log
# that only keeps this stage's output still names what failed.
failed_lines() {
  grep -E '^[^ ]+:[0-9]+: failed' "$1" | head -n 20
}

# The CPU tests (all but [cuda]) with the GPU hidden, so that `backend: auto` in them means the
# CPU, as elsewhere: split into one share per core (at most 8), each a process of its own, as
# CTest runs them. A share is every k-th test name, escaped for Catch2's --input-file (where a
# comma or a bracket would split a name or start a tag). Writes each share's report and then
# all of them to $2; returns the first failing share's exit code.
cpu_tests() {
  local bin=$1 out=$2 k i r rc=0 pids=() names=$2.names
  k=$(nproc 2>/dev/null || echo 1); [ "$k" -gt 8 ] && k=8
  "$bin" "~[cuda]" --list-test-names-only |
    sed -e 's/\\/\\\\/g; s/,/\\,/g; s/\[/\\[/g; s/\]/\\]/g; s/"/\\"/g' > "$names"
  # An empty share would run every test, the [cuda] ones too.
  if [ "$(wc -l < "$names")" -lt "$k" ]; then
    echo "gpu-check: $bin listed fewer CPU tests than shares ($k)" | tee "$out"
    rm -f "$names"
    return 1
  fi
  for ((i = 0; i < k; i++)); do
    awk -v k="$k" -v i="$i" 'NR % k == i' "$names" > "$out.names-$i"
    # -w NoTests: a name that matches nothing (escaped wrongly) fails instead of passing unrun.
    CUDA_VISIBLE_DEVICES="" stdbuf -oL -eL "$bin" -f "$out.names-$i" -w NoTests -r compact \
      -d yes > "$out.$i" 2>&1 &
    pids+=($!)
  done
  : > "$out"
  for ((i = 0; i < k; i++)); do
    wait "${pids[$i]}"; r=$?
    [ "$rc" = 0 ] && rc=$r
    cat "$out.$i" >> "$out"
    echo "share $((i + 1)) of $k (exit $r): $(grep -E '^(Passed|Failed|All tests|No tests|test cases)' "$out.$i" | tail -n 1)"
    # A share killed by a signal, or one that stopped before its summary, shows its last lines.
    [ "$r" = 0 ] || tail -n 5 "$out.$i"
    rm -f "$out.$i" "$out.names-$i"
  done
  rm -f "$names"
  return "$rc"
}

# The whole suite with the GPU tests required: under DTRAIN_REQUIRE_GPU=1 a [cuda] test that
# cannot reach a GPU fails instead of skipping. In a rehearsal they must fail.
stage_tests() {
  local b rc_cpu rc_gpu
  b=$(bin_dir) || return 2
  need_data >/dev/null && export DTRAIN_TEST_DATA="$data"
  export DTRAIN_TEST_SOURCE_DIR="$root" DTRAIN_TEST_BINARY="$root/$b/apps/dtrain"
  # Line-buffered with each test's time, so a hang still leaves the tests that finished; the GPU
  # half gets at most 2/3 of the stage, so that the CPU half still runs after a hang.
  DTRAIN_REQUIRE_GPU=1 timeout -k 10 360 stdbuf -oL -eL "$b/tests/dtrain_tests" "[cuda]" \
    -r compact -d yes > "$sdir/tests-cuda.txt" 2>&1
  rc_gpu=$?
  tail -n 3 "$sdir/tests-cuda.txt"
  # The rest with the GPU hidden, so that `backend: auto` in them means the CPU, as elsewhere;
  # DTRAIN_GPU_CHECK_CPU_TESTS=0 leaves them to CI where GPU time is short.
  rc_cpu=0
  if [ "${DTRAIN_GPU_CHECK_CPU_TESTS:-1}" = 1 ]; then
    cpu_tests "$b/tests/dtrain_tests" "$sdir/tests-cpu.txt" || rc_cpu=$?
  fi
  if [ "$rc_cpu" != 0 ]; then
    echo "gpu-check: the CPU tests failed:"
    failed_lines "$sdir/tests-cpu.txt"
    return 1
  fi
  if [ "$rehearsal" = 1 ]; then
    # Failing for the right reason: the missing GPU, not a crash or an empty test list.
    if [ "$rc_gpu" = 0 ] || ! grep -q "DTRAIN_REQUIRE_GPU=1 but no GPU" "$sdir/tests-cuda.txt"; then
      echo "gpu-check: the [cuda] tests did not fail for want of a GPU under DTRAIN_REQUIRE_GPU=1"
      return 1
    fi
    echo "gpu-check: rehearsal: the [cuda] tests fail without a GPU, as they must"
    return 0
  fi
  if [ "$rc_gpu" != 0 ]; then
    echo "gpu-check: the GPU tests failed (exit $rc_gpu):"
    failed_lines "$sdir/tests-cuda.txt"
    return 1
  fi
}

skipped=10  # a stage's exit code for "nothing to do here"

stage_bench() {
  if [ "$rehearsal" = 1 ]; then echo "gpu-check: rehearsal: the benchmark needs a GPU"; return $skipped; fi
  need_data || return 2
  local b
  b=$(bin_dir) || return 2
  # DTRAIN_BENCH_MODELS (mlp, cnn, resnet18, gpt), _MODES and _BATCHES (default: each
  # model's) split the benchmark over calls (compilation makes it long): e.g.
  # DTRAIN_BENCH_MODELS=resnet18,gpt DTRAIN_BENCH_MODES=graph,compile.
  local batches=()
  [ -n "${DTRAIN_BENCH_BATCHES:-}" ] && batches=(--batches "$DTRAIN_BENCH_BATCHES")
  python3 scripts/bench/gpu_vs_pytorch.py --dtrain "$b/apps/dtrain" --data "$data" \
    --out "$sdir" --models "${DTRAIN_BENCH_MODELS:-mlp,cnn}" \
    --modes "${DTRAIN_BENCH_MODES:-eager,graph,compile,compile-max}" \
    ${batches[@]+"${batches[@]}"} --epochs 4 --repeats 2
}

# Where a step's GPU time goes (the profile stage, below): ncu's per-kernel times of the CNN at
# batch 1024 and 128, ResNet-18 and the GPT in bf16, graphs off so that each kernel is one
# launch, a few steady steps after the first; PyTorch's eager steps beside them; each ranked
# by scripts/bench/ncu_kernel_sums.py.
# ncu of one program's kernels, summed per kernel (and by family with --families):
# profile_one NAME SKIP COUNT [--families] -- COMMAND...
profile_one() {
  local name=$1 skip=$2 count=$3 fam=() rc=0
  shift 3
  [ "$1" = --families ] && { fam=(--families); shift; }
  shift  # --
  "$ncu" --metrics gpu__time_duration.sum --print-summary per-kernel --launch-skip "$skip" \
    --launch-count "$count" "$@" > "$sdir/ncu-$name.txt" 2>&1 || rc=1
  python3 scripts/bench/ncu_kernel_sums.py "$sdir/ncu-$name.txt" ${fam[@]+"${fam[@]}"} || rc=1
  return $rc
}

# The CNN at batch 1024 and 128, dtrain's and PyTorch's (eager) kernels.
profile_cnn() {
  local batch rc=0
  for batch in 1024 128; do
    profile_one "cnn$batch" 400 300 -- "$b/apps/dtrain" run configs/fmnist-cnn.yaml backend=cuda \
      "data.path=$data" train.per_replica_batch=$batch train.cuda_graph=false train.epochs=1 \
      optimizer.warmup_epochs=0 data.train_limit=16384 data.test_limit=1024 \
      --results "$sdir/runs" --tag "cnn-b$batch" --quiet || rc=1
  done
  [ "$torch" = 1 ] || return $rc
  profile_one torch-cnn1024 3000 400 -- python3 scripts/bench/torch_mlp.py --device=cuda \
    --model=cnn --batch=1024 --epochs=2 --scaling=sqrt --threads=1 "--data=$data" --mode=eager || rc=1
  return $rc
}

# ResNet-18 in bf16 on synthetic CIFAR-sized images, kernels summed by family (casts and layout
# transposes were 43% of its kernel time on 2026-11-29).
profile_resnet18() {
  local rc=0
  profile_one resnet18 2000 600 --families -- "$b/apps/dtrain" run configs/cifar10-resnet18.yaml \
    backend=cuda precision=bf16 train.cuda_graph=false train.epochs=1 optimizer.warmup_epochs=0 \
    data.dataset=synthetic 'data.synthetic.shape=[3,32,32]' data.synthetic.train_size=8192 \
    data.synthetic.test_size=256 data.augment.flip=false data.augment.crop_padding=0 \
    --results "$sdir/runs" --tag resnet18 --quiet || rc=1
  [ "$torch" = 1 ] || return $rc
  profile_one torch-resnet18 3000 600 --families -- python3 scripts/bench/torch_mlp.py \
    --device=cuda --model=resnet --depth=18 --widths=64,128,256,512 --synthetic=3,32,32 \
    --train-size=8192 --test-size=256 --batch=128 --epochs=1 --lr=0.1 --base-batch=128 \
    --warmup=0 --threads=1 --mode=eager --precision=bf16 --channels-last || rc=1
  return $rc
}

# The benchmark's GPT (nanoGPT's Shakespeare size, bf16, batch 64) on the bytes of lib/: it ran
# at 0.43x of eager PyTorch on 2026-11-29, unprofiled. About 2 steps of each.
profile_gpt() {
  local rc=0
  profile_one gpt 1500 800 --families -- "$b/apps/dtrain" run configs/bytes-gpt.yaml \
    backend=cuda precision=bf16 train.cuda_graph=false train.epochs=1 "data.path=$root/lib" \
    data.exclude=[] "data.sha256=''" data.block_size=256 model.n_layer=6 model.n_head=6 \
    model.n_embd=384 train.per_replica_batch=64 optimizer.base_batch=64 data.train_limit=1024 \
    --results "$sdir/runs" --tag gpt --quiet || rc=1
  [ "$torch" = 1 ] || return $rc
  profile_one torch-gpt 1500 800 --families -- python3 scripts/bench/torch_gpt.py --device=cuda \
    --precision=bf16 --mode=eager "--data=$root/lib" --block=256 --n-layer=6 --n-head=6 --n-embd=384 \
    --batch=64 --train-limit=1024 --epochs=1 --threads=1 || rc=1
  return $rc
}

# DTRAIN_PROFILE_MODELS (default cnn,resnet18,gpt): which models the profile stage runs.
stage_profile() {
  if [ "$rehearsal" = 1 ]; then echo "gpu-check: rehearsal: the profile needs a GPU"; return $skipped; fi
  need_data || return 2
  local b ncu torch=0 m rc=0 models
  b=$(bin_dir) || return 2
  ncu=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
  [ -x "$ncu" ] || { echo "gpu-check: no ncu here"; return 1; }
  python3 -c 'import torch' 2>/dev/null && torch=1
  IFS=, read -ra models <<< "${DTRAIN_PROFILE_MODELS:-cnn,resnet18,gpt}"
  for m in "${models[@]}"; do
    m=${m// /}
    case $m in
      cnn) profile_cnn || rc=1 ;;
      resnet18) profile_resnet18 || rc=1 ;;
      gpt) profile_gpt || rc=1 ;;
      *) echo "gpu-check: DTRAIN_PROFILE_MODELS: unknown model '$m' (valid: cnn, resnet18, gpt)"; rc=1 ;;
    esac
  done
  return $rc
}

# The training runs on the GPU: config, overrides (split on spaces) and tag.
gpu_runs=(
  "configs/fmnist-cnn.yaml|train.epochs=2 optimizer.warmup_epochs=1|cnn"
  "configs/fmnist-cnn.yaml|precision=bf16 train.epochs=2 optimizer.warmup_epochs=1|cnn-bf16"
  "configs/quickstart.yaml|train.epochs=2 train.cuda_graph=false|mlp-eager"
  "configs/quickstart.yaml|colocate=true gpus=1,4 replicas=threads train.epochs=2|mlp-colocated"
  "configs/quickstart.yaml|colocate=true devices=[0] gpus=4 replicas=shared train.epochs=2|mlp-colocated-shared"
  "configs/quickstart.yaml|train.accumulation_steps=4 train.per_replica_batch=16 train.epochs=2|mlp-accum"
  "configs/fmnist-cnn.yaml|colocate=true devices=[0] gpus=1,4 replicas=shared model.batchnorm=sync train.epochs=2 optimizer.warmup_epochs=1|cnn-shared-syncbn"
  # The GPT reads a corpus every Debian and Ubuntu system has (a bare machine lacks the
  # fortunes package), not Fashion-MNIST.
  "configs/bytes-gpt.yaml|train.epochs=1 data.path=/usr/share/common-licenses data.exclude=[] data.sha256=''|gpt"
  "configs/bytes-gpt.yaml|colocate=true gpus=1,4 replicas=shared train.epochs=1 data.path=/usr/share/common-licenses data.exclude=[] data.sha256=''|gpt-colocated"
  # The residual networks: ResNet-20 on a sixth of Fashion-MNIST, fp32 and bf16, and ResNet-50
  # on synthetic 3x224x224 images in bf16 (no files needed).
  "configs/fmnist-resnet.yaml|train.epochs=1 data.train_limit=10000|resnet20"
  "configs/fmnist-resnet.yaml|precision=bf16 train.epochs=1 data.train_limit=10000|resnet20-bf16"
  "configs/resnet50-synthetic.yaml|precision=bf16 train.epochs=1|resnet50-bf16"
)

# One line per run from its summary.json, which dtrain writes one top-level key per line,
# indented by two spaces (nested objects are indented further and not read here).
summary_line() {
  awk -v file="$1" '
    /^  "[a-z_]+": / {
      k = $1; gsub(/[":]/, "", k)
      v = substr($0, index($0, ": ") + 2); sub(/,$/, "", v); gsub(/^"|"$/, "", v)
      d[k] = v
    }
    function get(k) { return (k in d) ? d[k] : "?" }
    END {
      printf "%s: %s, %s, graphs %s (%s steps), %.3f s/epoch, %.2f%%\n", file, get("devices"),
        get("precision"), get("cuda_graph"), get("cuda_graph_steps"), get("median_epoch_time_s"),
        100 * get("final_test_accuracy")
    }' "$1"
}

stage_runs() {
  local b rc=0 spec cfg over tag
  b=$(bin_dir) || return 2
  need_data || return 2
  for spec in "${gpu_runs[@]}"; do
    IFS='|' read -r cfg over tag <<<"$spec"
    read -ra over <<<"$over"
    add_data_path over
    if [ "$rehearsal" = 1 ]; then
      # No GPU: the same runs must at least validate, on the CPU.
      "$b/apps/dtrain" validate "$cfg" backend=cpu "${over[@]}" || rc=1
    else
      "$b/apps/dtrain" run "$cfg" backend=cuda "${over[@]}" \
        --results "$sdir" --tag "$tag" --quiet || rc=1
    fi
  done
  if [ "$rehearsal" = 1 ]; then
    # The carried binary trains from the carried data on the CPU.
    "$b/apps/dtrain" run configs/quickstart.yaml backend=cpu gpus=1,2 train.epochs=1 \
      optimizer.warmup_epochs=0 data.train_limit=6000 data.test_limit=1000 data.path="$data" \
      --results "$sdir" --tag rehearsal --quiet || rc=1
    return $rc
  fi
  for s in "$sdir"/*/*/summary.json; do
    [ -f "$s" ] && summary_line "$s"
  done
  return $rc
}

# compute-sanitizer's memcheck, racecheck and synccheck (DTRAIN_SANITIZER_TOOLS picks some) on
# short runs: the MLP and the CNN with CUDA graphs on and off, the CNN in bf16, accumulation with
# a checkpoint every step, and two colocated replicas (a copy of the weights each; one
# shared copy; shared with synchronised BatchNorm), ResNet-8 in fp32 and bf16, and a small GPT.
# The three tools run at the same time, each through two halves of its runs at once (the
# sanitizer's cost is on the host; the GPU has room for all). A run passes on exit 0 with
# "ERROR SUMMARY: 0 errors" (memcheck, synccheck) or "0 hazards" (racecheck; or hazards in
# NVIDIA's library kernels alone, named); each run's log keeps the tool's summary line.
# memcheck runs with --report-api-errors no: NCCL's communicator setup probes its kernels with
# cudaFuncGetAttributes and handles "no kernel image" itself, which memcheck would otherwise count
# as errors; an API error in dtrain's own calls ends the run with a nonzero exit instead.
sanitizer_runs=(
  "configs/quickstart.yaml|gpus=1 train.cuda_graph=true|mlp-graph"
  "configs/quickstart.yaml|gpus=1 train.cuda_graph=false|mlp-eager"
  "configs/quickstart.yaml|gpus=1 train.accumulation_steps=2 train.checkpoint_steps=1|mlp-accum-ckpt"
  "configs/fmnist-cnn.yaml|gpus=1 train.cuda_graph=true|cnn-graph"
  "configs/fmnist-cnn.yaml|gpus=1 train.cuda_graph=false|cnn-eager"
  "configs/fmnist-cnn.yaml|gpus=1 precision=bf16|cnn-bf16"
  "configs/quickstart.yaml|gpus=2 colocate=true replicas=threads|mlp-colocated"
  "configs/quickstart.yaml|gpus=2 colocate=true devices=[0] replicas=shared|mlp-colocated-shared"
  "configs/fmnist-cnn.yaml|gpus=2 colocate=true devices=[0] replicas=shared model.batchnorm=sync|cnn-shared-syncbn"
  "configs/fmnist-resnet.yaml|gpus=1 model.depth=8|resnet8"
  "configs/fmnist-resnet.yaml|gpus=1 model.depth=8 precision=bf16|resnet8-bf16"
  "configs/bytes-gpt.yaml|gpus=1 model.n_layer=2 data.path=/usr/share/common-licenses data.exclude=[] data.sha256=''|gpt"
)
# One tool through half the runs (those whose index has parity $4); prints a line per run;
# returns 1 if any run did not pass. Racecheck counts hazards in every kernel, NVIDIA's libraries'
# too: a run passes it with hazards only where none lies in a kernel of dtrain's
# (a library's by its name's prefix, below); the line names the library kernels.
library_kernels='nvjet_|cutlass|cudnn|xmma|sm[0-9]+_|nccl'  # cuBLAS, cuDNN and NCCL kernels
sanitize_with() {
  local tool=$1 cs=$2 b=$3 parity=$4 spec cfg over tag log r line rc=0 opts pass i=0 ours lib
  local names finished
  # Few steps: every kernel launch under the sanitizer costs milliseconds.
  local short=(train.epochs=1 optimizer.warmup_epochs=0 data.train_limit=512 data.test_limit=128)
  # racecheck tracks every shared-memory access: on an H200 with all three tools at once, the
  # CNN's 8 steps took 89 s under it (2026-11-29), so it gets half the steps.
  [ "$tool" = racecheck ] &&
    short=(train.epochs=1 optimizer.warmup_epochs=0 data.train_limit=256 data.test_limit=64)
  opts=(--tool "$tool" --error-exitcode 99)
  pass='ERROR SUMMARY: 0 errors'
  [ "$tool" = memcheck ] && opts+=(--report-api-errors no)
  [ "$tool" = racecheck ] && pass='SUMMARY: 0 hazards'
  for spec in "${sanitizer_runs[@]}"; do
    i=$((i + 1))
    [ $((i % 2)) = "$parity" ] || continue
    IFS='|' read -r cfg over tag <<<"$spec"
    read -ra over <<<"$over"
    add_data_path over
    log="$sdir/$tool-$tag.log"
    timeout -k 5 "${DTRAIN_SANITIZER_RUN_LIMIT:-150}" "$cs" "${opts[@]}" \
      "$b/apps/dtrain" run "$cfg" backend=cuda "${short[@]}" "${over[@]}" \
      --results "$sdir/runs-$tool" --tag "$tag" --quiet > "$log" 2>&1
    r=$?
    line=$(grep -E '(ERROR|RACECHECK) SUMMARY' "$log" | tail -n 1)
    if [ "$tool" = racecheck ] && [ "$r" = 99 ] && [ -n "$line" ]; then
      # Every access named (both sides of each race) must be in a library kernel, at least one
      # must be named, and the run itself must have finished (99 hides dtrain's own exit code).
      names=$(sed -nE 's/.*access at (void )?([^ (<+]+).*/\2/p' "$log")
      ours=$(grep -cvE "^($library_kernels)" <<<"$names")
      lib=$(sort -u <<<"$names" | tr '\n' ' ')
      finished=$(cat "$sdir/runs-$tool"/*/"$tag"-g*/status 2>/dev/null)
      if [ -n "$names" ] && [ "$ours" = 0 ] && [ "$finished" = done ]; then
        echo "$tool $tag: exit $r; $line; none in dtrain's kernels, all in library kernels: $lib"
        continue
      fi
    fi
    echo "$tool $tag: exit $r; ${line:-no summary line}"
    [ "$r" = 0 ] && grep -q "$pass" <<<"$line" || rc=1
  done
  return $rc
}
stage_sanitizer() {
  if [ "$rehearsal" = 1 ]; then echo "gpu-check: rehearsal: the sanitizer needs a GPU"; return $skipped; fi
  local b cs tool parity rc=0 pids=()
  b=$(bin_dir) || return 2
  need_data || return 2
  cs=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
  [ -x "$cs" ] || { echo "gpu-check: no compute-sanitizer here"; return 1; }
  "$cs" --version | tail -n 1
  rm -f "$sdir"/*check-[01].txt  # an earlier call's, where OUT is unset and the folder stays
  # Each tool's runs in two halves at once: the sanitizer's cost is on the host, one core a run.
  for tool in ${DTRAIN_SANITIZER_TOOLS:-memcheck racecheck synccheck}; do
    for parity in 0 1; do
      sanitize_with "$tool" "$cs" "$b" "$parity" > "$sdir/$tool-$parity.txt" &
      pids+=($!)
    done
  done
  for p in "${pids[@]}"; do wait "$p" || rc=1; done
  cat "$sdir"/*check-[01].txt
  return $rc
}

if [ -n "$one_stage" ]; then
  mkdir -p "$sdir"
  "stage_$one_stage"
  exit
fi

limit_for() { case $1 in probe) echo 120 ;; devices) echo 180 ;; *) echo 560 ;; esac; }

budget=${DTRAIN_GPU_CHECK_BUDGET:-570}
call_start=$SECONDS
overall=0
for s in "${stages[@]}"; do
  log="$dest/$s.log"
  # The stage's own limit, cut to what is left of this call's budget (20 s kept for archiving).
  left=$((budget - (SECONDS - call_start) - 20))
  limit=$(limit_for "$s")
  [ "$left" -lt "$limit" ] && limit=$left
  started=$(date -u +%H:%M:%S)
  t0=$SECONDS
  if [ "$limit" -lt 30 ]; then
    echo "## $s: not started, this call's budget of $budget s is spent; run it in its own call"
    rc=125
  else
    echo "## $s (log: $log, limit $limit s)"
    # Each stage is this script run again for one stage, under timeout, so a hang is cut.
    DTRAIN_GPU_CHECK_DEST=$dest timeout --kill-after=10 "$limit" bash "$self" --stage "$s" 2>&1 |
      tee "$log"
    rc=${PIPESTATUS[0]}
  fi
  case $rc in
    0) result=passed ;;
    10) result=skipped ;;
    124|137) result="timed out"; overall=1 ;;
    125) result="not started (no time left in this call)"; overall=1 ;;
    2) result="cannot start"; [ "$overall" = 0 ] && overall=2 ;;
    *) result="failed ($rc)"; overall=1 ;;
  esac
  [ "$rehearsal" = 1 ] && result="$result (rehearsal)"
  printf '| %s | %s | %s | %s | %s |\n' "$s" "$result" "$((SECONDS - t0))" "$started" "$commit" >> "$dest/stages.md"
  # One archive per stage with files of its own: what comes back from a GPU machine is a few
  # files, two folders deep.
  if [ -d "$dest/$s" ] && [ -n "$(ls -A "$dest/$s")" ]; then
    tar -C "$dest" -czf "$dest/$s.tar.gz" "$s" && [ -n "${OUT:-}" ] && rm -rf "${dest:?}/$s"
  else
    rm -rf "${dest:?}/$s"
  fi
done
echo "## stages"
cat "$dest/stages.md"
echo "evidence: $dest"
[ "$no_gpu" = 1 ] && exit 3
exit "$overall"
