#!/usr/bin/env bash
# The committed study in results/study/: the quickstart Fashion-MNIST MLP at 1 to 8 replicas,
# LR rules none/linear/sqrt at three learning rates with mean reduction, and the same rules with
# sum reduction at lr 0.05. About 8 minutes on 2 cores; resumable.
set -euo pipefail
cd "$(dirname "$0")/.."
export RESULTS=${RESULTS:-results/study}
TAG=lr scripts/sweep-lr.sh configs/quickstart.yaml
TAG=sum scripts/sweep-gpus.sh configs/quickstart.yaml optimizer.lr_scaling=none,linear,sqrt \
  train.reduction=sum
