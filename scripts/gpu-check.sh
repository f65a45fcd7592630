#!/usr/bin/env bash
# On a GPU machine: probe it, build dtrain with CUDA, run the GPU tests and the GPU smoke
# benchmark, and print a short table last. Everything it prints is also written under
# results/gpu/<date>-<gpu>/ (or $OUT/gpu/... when OUT is set) as evidence of the run.
#
#   scripts/gpu-check.sh            # from the repository root
#
# Without a GPU it stops after the probe and says so (exit code 3).
set -uo pipefail
cd "$(dirname "$0")/.."
stamp=$(date -u +%Y%m%d-%H%M%S)
gpu_name=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 | tr ' ' '-')
dest="${OUT:-results}/gpu/${stamp}-${gpu_name:-nogpu}"
mkdir -p "$dest"
log="$dest/gpu-check.log"
exec > >(tee "$log") 2>&1
echo "# gpu-check $stamp, commit $(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)"

echo "## probe"
( set -x
  nvidia-smi
  nvcc --version || /usr/local/cuda/bin/nvcc --version
  ldd --version | head -1
  cmake --version | head -1
  python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "nccl", torch.cuda.nccl.version())'
  ls /usr/local/cuda/lib64 | grep -E 'libcudnn.so|libnccl.so|libcublas.so' | head
  find / -xdev \( -name 'libnccl.so*' -o -name 'libcudnn.so*' -o -name 'yaml.h' -o -name 'CLI.hpp' \
       -o -name 'cblas.h' -o -name 'dnnl.hpp' \) 2>/dev/null | head -40
) > "$dest/probe.txt" 2>&1
cat "$dest/probe.txt"
if ! nvidia-smi -L >/dev/null 2>&1; then
  echo "gpu-check: no GPU on this machine; nothing CUDA can run here"
  exit 3
fi

echo "## build"
# The CUDA libraries may live in the PyTorch environment's wheels rather than the toolkit.
for lib in libcudnn.so.9 libnccl.so.2 libcublas.so.13; do
  if ! ldconfig -p 2>/dev/null | grep -q "$lib"; then
    d=$(find / -xdev -name "$lib" 2>/dev/null | head -1)
    [ -n "$d" ] && export LD_LIBRARY_PATH="$(dirname "$d")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  fi
done
echo "LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}"
build=build-gpu
status_build=ok
if cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 \
   && cmake --build "$build" -j"$(nproc)"; then
  status_build="ok (built here)"
elif [ -f .gpu-carry/dtrain-portable.tar.xz ]; then
  # Built elsewhere by scripts/build-portable.sh and carried here.
  rm -rf build-carried && mkdir -p build-carried
  tar -C build-carried -xJf .gpu-carry/dtrain-portable.tar.xz
  build=build-carried
  status_build="ok (portable binaries)"
else
  status_build=failed
fi
bin="$build/apps/dtrain"

status_devices=skipped status_tests=skipped status_bench=skipped status_cnn=skipped
status_bf16=skipped status_eager=skipped
if [ "$status_build" != failed ]; then
  echo "## dtrain devices"
  "$bin" devices --measure | tee "$dest/devices.txt" && status_devices=ok || status_devices=failed
  echo "## GPU tests"
  "$build/tests/dtrain_tests" "[cuda]" -s -r compact > "$dest/tests-cuda.txt" 2>&1 \
    && status_tests=passed || status_tests=failed
  tail -5 "$dest/tests-cuda.txt"
  echo "## GPU benchmark: dtrain against eager PyTorch, quickstart MLP, batch 128 and 1024"
  python3 scripts/bench/gpu_vs_pytorch.py --dtrain "$bin" --out "$dest" --epochs 5 --repeats 3 \
    && status_bench=ok || status_bench=failed
  echo "## the small CNN on the GPU (cuDNN), 2 epochs"
  "$bin" run configs/fmnist-cnn.yaml backend=cuda train.epochs=2 optimizer.warmup_epochs=1 \
    --results "$dest/runs" --tag cnn --quiet && status_cnn=ok || status_cnn=failed
  echo "## the same in bf16, and the MLP without CUDA graphs"
  "$bin" run configs/fmnist-cnn.yaml backend=cuda precision=bf16 train.epochs=2 \
    optimizer.warmup_epochs=1 --results "$dest/runs" --tag cnn-bf16 --quiet \
    && status_bf16=ok || status_bf16=failed
  "$bin" run configs/quickstart.yaml backend=cuda train.epochs=2 train.cuda_graph=false \
    --results "$dest/runs" --tag mlp-eager --quiet && status_eager=ok || status_eager=failed
fi

echo "## summary"
printf '| step | result |\n|---|---|\n'
printf '| GPU | %s |\n' "${gpu_name:-none}"
printf '| build | %s |\n' "$status_build"
printf '| dtrain devices | %s |\n' "$status_devices"
printf '| GPU tests | %s |\n' "$status_tests"
printf '| benchmark against PyTorch | %s |\n' "$status_bench"
printf '| CNN on the GPU | %s |\n' "$status_cnn"
printf '| CNN in bf16 | %s |\n' "$status_bf16"
printf '| MLP without CUDA graphs | %s |\n' "$status_eager"
[ -f "$dest/gpu-mlp-vs-pytorch.md" ] && tail -n 4 "$dest/gpu-mlp-vs-pytorch.md"
for s in "$dest"/runs/*/*/summary.json; do
  [ -f "$s" ] && python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print('| %s, %s, graphs %s (%s steps) | %.3f s/epoch, %.2f%% |' % (d.get('devices','?'), d.get('precision','?'), d.get('cuda_graph','?'), d.get('cuda_graph_steps','?'), d['median_epoch_time_s'], 100*d['final_test_accuracy']))" "$s"
done
echo "evidence: $dest"
[ "$status_build" != failed ] && [ "$status_tests" = passed ]
