#!/usr/bin/env bash
# One GPU call: the [cuda] tests of this commit, then the benchmark against PyTorch's modes.
o=$OUT; t0=$SECONDS
export OUT=/tmp/gc DTRAIN_GPU_CHECK_BUDGET=110 DTRAIN_GPU_CHECK_CPU_TESTS=0 PYTHONUNBUFFERED=1
scripts/gpu-check.sh probe build devices tests > "$o/check.log" 2>&1
cat /tmp/gc/*/stages.md >> "$o/check.log"; tar -C /tmp/gc -czf "$o/check.tar.gz" .
cat /tmp/gc/*/stages.md
bin=build-carried/apps/dtrain; data=.gpu-carry/data/fashion-mnist
echo "checks done at $((SECONDS - t0)) s"
timeout -k 5 210 python3 scripts/bench/gpu_vs_pytorch.py --dtrain $bin --data $data \
  --out "$o/eager-graph" --models mlp,cnn --modes eager,graph --epochs 4 --repeats 2 2>&1 | tee "$o/eager-graph.log"
echo "eager/graph done at $((SECONDS - t0)) s"
left=$((515 - (SECONDS - t0)))
timeout -k 5 $left python3 scripts/bench/gpu_vs_pytorch.py --dtrain $bin --data $data \
  --out "$o/compile" --models mlp,cnn --modes compile --epochs 4 --repeats 2 2>&1 | tee "$o/compile.log"
echo "compile done at $((SECONDS - t0)) s"
