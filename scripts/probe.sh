#!/usr/bin/env bash
# Hostile and clumsy input through the real binary: every case must end the way it should (its
# exit code, and for a user mistake exit 2 with one line, `dtrain: error: ...`, naming what is
# wrong), within a time and a peak-memory bound, and without running anything it was handed.
# The regression net for bad configs, data files, names, sweeps, run folders and checkpoints.
#
#   scripts/probe.sh [DTRAIN]        # default build/apps/dtrain
#
# Prints one row per case (exit code, lines of output, peak MiB, seconds) and exits 1 if any
# case failed. Needs GNU time (/usr/bin/time) for the peak memory.
set -uo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
bin=$(readlink -f "${1:-$here/build/apps/dtrain}")
[ -x "$bin" ] || { echo "probe: no dtrain binary at $bin (build first, or name it)"; exit 2; }
[ -x /usr/bin/time ] || { echo "probe: /usr/bin/time (GNU time) is missing: scripts/install-deps.sh installs it"; exit 2; }
t=$(mktemp -d "${TMPDIR:-/tmp}/dtrain-probe.XXXXXX")
trap 'rm -rf "$t"' EXIT
cd "$t"

max_mib=${PROBE_MAX_MIB:-700}
max_s=${PROBE_MAX_S:-20}
failed=0 total=0
printf '| case | exit | lines | peak MiB | s | result |\n|---|---|---|---|---|---|\n'

# probe NAME WANT_EXIT PATTERN -- ARGS...: runs dtrain ARGS; PATTERN must appear in its output.
# WANT_EXIT 2 also asks for exactly one line of output; 2+ for exit 2 after the run's log lines.
probe() {
  local name=$1 want=$2 pattern=$3 rc lines mib secs why=""
  shift 4
  /usr/bin/time -f '%M %e' -o "$t/time" timeout -k 5 "$max_s" "$bin" "$@" >"$t/out" 2>&1
  rc=$?
  lines=$(wc -l <"$t/out")
  # The last line: GNU time first notes a nonzero exit on a line of its own.
  read -r kib secs < <(tail -n 1 "$t/time") || { kib=0; secs=0; }
  [ "$kib" -eq "$kib" ] 2>/dev/null || kib=0
  mib=$((kib / 1024))
  local one_line=0
  [ "$want" = 2 ] && one_line=1
  [ "$want" = 2+ ] && want=2
  [ "$rc" = "$want" ] || why="exit $rc, not $want"
  [ -z "$why" ] && [ "$one_line" = 1 ] && [ "$lines" != 1 ] && why="$lines lines, not 1"
  [ -z "$why" ] && ! grep -qF -- "$pattern" "$t/out" && why="no '$pattern' in the output"
  [ -z "$why" ] && [ "$mib" -gt "$max_mib" ] && why="peak $mib MiB > $max_mib"
  total=$((total + 1))
  if [ -n "$why" ]; then
    failed=$((failed + 1))
    printf '| %s | %s | %s | %s | %s | FAILED: %s |\n' "$name" "$rc" "$lines" "$mib" "$secs" "$why"
    sed 's/^/    /' "$t/out" | head -n 5
  else
    printf '| %s | %s | %s | %s | %s | ok |\n' "$name" "$rc" "$lines" "$mib" "$secs"
  fi
}
# must_not_exist NAME FILE: a command handed a string was not run.
must_not_exist() {
  total=$((total + 1))
  if [ -e "$2" ]; then
    failed=$((failed + 1)); printf '| %s | | | | | FAILED: %s exists: input became code |\n' "$1" "$2"
  else
    printf '| %s | | | | | ok |\n' "$1"
  fi
}

tiny() {  # a config that trains in a fraction of a second
  cat <<EOF
name: ${1:-tiny}
threads: 1
data:
  dataset: synthetic
  synthetic: {train_size: 512, test_size: 128, shape: [${2:-8}], classes: 3, noise: 1.0}
model: {hidden: [16]}
train: {epochs: 2, per_replica_batch: 16, target_accuracy: 0}
optimizer: {lr: 0.05, base_batch: 16, warmup_epochs: 0}
EOF
}
tiny > ok.yaml
# IDX headers: big-endian 32-bit words.
idx() { local f=$1; shift; for w in "$@"; do printf "\\x$(printf %02x $((w >> 24 & 255)))\\x$(printf %02x $((w >> 16 & 255)))\\x$(printf %02x $((w >> 8 & 255)))\\x$(printf %02x $((w & 255)))"; done >"$f"; }
mkdir -p big over
idx big/train-images-idx3-ubyte 2051 60000 256 256  # a 3.9 GB claim in 16 bytes
idx big/train-labels-idx1-ubyte 2049 60000
cp big/train-* over/ && idx over/train-images-idx3-ubyte 2051 1 4294967295 4294967295
for d in big over; do cp $d/train-images-idx3-ubyte $d/t10k-images-idx3-ubyte; cp $d/train-labels-idx1-ubyte $d/t10k-labels-idx1-ubyte; done
# gzip IDX files: trailing garbage after the stream, a payload longer than its header; labels
# 0-2 and one byte of 200 (a 201-way output layer).
mkdir -p junk longer sparse
idx junk/train-images-idx3-ubyte 2051 16 2 2 && head -c 64 /dev/zero >>junk/train-images-idx3-ubyte
idx junk/train-labels-idx1-ubyte 2049 16 && head -c 16 /dev/zero >>junk/train-labels-idx1-ubyte
cp junk/train-images-idx3-ubyte junk/t10k-images-idx3-ubyte && cp junk/train-labels-idx1-ubyte junk/t10k-labels-idx1-ubyte
cp junk/* longer/ && cp junk/* sparse/ && gzip -f junk/* longer/* && printf 'garbage' >>junk/train-images-idx3-ubyte.gz
printf '\x01' | gzip >>longer/train-labels-idx1-ubyte.gz  # a second member: a 17th label
printf '\x00\x01\x02\x00\x01\x02\x00\x01\x02\x00\x01\x02\x00\x01\x02\xc8' |
  dd of=sparse/train-labels-idx1-ubyte bs=1 seek=8 conv=notrunc status=none
mkfifo fifo.yaml
mkdir -p fifodata && cp big/* fifodata/ && rm fifodata/train-images-idx3-ubyte &&
  mkfifo fifodata/train-images-idx3-ubyte
: > empty.yaml

# Configs and overrides.
probe layers-activation-first 0 "done" -- run ok.yaml model.type=layers 'model.layers=[relu]' --tag act --results res
probe idx-3.9GB-claim 2 "truncated" -- validate ok.yaml data.dataset=fashion-mnist data.path=big
probe idx-size-overflow 2 "implausible image size" -- validate ok.yaml data.dataset=fashion-mnist data.path=over
list=$(seq -s, 1 1000)
probe sweep-billion-runs 2 "more than 10000 runs" -- validate ok.yaml train.seed=$list train.epochs=$list train.eval_batch=$list
probe batch-overflow 2 "error" -- validate ok.yaml train.per_replica_batch=4611686018427387904 gpus=2
probe shape-overflow 2 "error" -- validate ok.yaml 'data.synthetic.shape=[4294967296,4294967296]'
probe hidden-oversized 2 "every entry must be in [1, 1048576]" -- validate ok.yaml 'model.hidden=[4000000000]'
probe hidden-past-memory 2 "GiB" -- validate ok.yaml 'model.hidden=[1048576,1048576]'
probe kernel-larger-than-map 2 "does not fit a 8x8 input" -- validate ok.yaml 'data.synthetic.shape=[1,8,8]' model.type=layers \
  'model.layers=[{conv: {channels: 4, kernel: 9}}]'
probe synthetic-trillion 2 "data.synthetic: 1000000000000 training" -- validate ok.yaml data.synthetic.train_size=1000000000000
probe synthetic-trillion-run 2+ "data.synthetic: 1000000000000 training" -- run ok.yaml data.synthetic.train_size=1000000000000 --tag big --results res
probe gzip-trailing-garbage 2 "trailing garbage after the gzip stream" -- validate ok.yaml data.dataset=idx data.path=junk
probe idx-longer-than-header 2 "more data than its header claims" -- validate ok.yaml data.dataset=idx data.path=longer
probe sparse-labels-validate 0 "[sparse-labels] the training labels are 0-2 (5 each) and 200 (1)" -- validate ok.yaml data.dataset=idx data.path=sparse
probe sparse-labels-doctor 0 "doctor: [sparse-labels]" -- doctor ok.yaml data.dataset=idx data.path=sparse
# Image folders (dataset: folder): a PNG whose header claims 100000 x 100000 pixels (33 bytes,
# CRC valid, refused before anything is allocated), a FIFO in a class folder, a tree without test/.
"$bin" export-images ok.yaml 'data.synthetic.shape=[3,8,8]' --out tree >/dev/null
printf '\x89PNG\r\n\x1a\n\x00\x00\x00\x0dIHDR\x00\x01\x86\xa0\x00\x01\x86\xa0\x08\x02\x00\x00\x00\x27\x30\x9c\x9f' \
  >tree/train/1/zz-huge.png
cp -r tree fifotree && rm fifotree/train/1/zz-huge.png && mkfifo fifotree/train/2/pipe.png
mkdir -p notest && cp -r tree/train notest/
folder=(data.dataset=folder 'data.shape=[3,8,8]' data.normalize=false)
probe folder-png-100000-claim 2+ "claims 100000 x 100000 pixels" -- run ok.yaml "${folder[@]}" data.path=tree --tag png --results res
probe folder-skip-bad-file 0 "1 files skipped" -- run ok.yaml "${folder[@]}" data.path=tree data.on_bad_file=skip --tag skip --results res
probe folder-fifo 2 "pipe.png: not a regular file" -- validate ok.yaml "${folder[@]}" data.path=fifotree
probe folder-no-test 2 "test: no such folder" -- validate ok.yaml "${folder[@]}" data.path=notest
probe folder-two-channels 2 "C 1 (grey) or 3 (RGB)" -- validate ok.yaml data.dataset=folder 'data.shape=[2,8,8]' data.path=tree --no-data
probe name-not-utf8 2 "UTF-8" -- validate ok.yaml "name=$(printf 'a\xffb')"
# Eleven levels of ten aliases: 600 bytes standing for 10^11 values.
{ echo 'a0: &a0 [x, x, x, x, x, x, x, x, x, x]'
  for i in $(seq 1 11); do
    printf 'a%d: &a%d [' "$i" "$i"; for k in $(seq 1 10); do printf '*a%d, ' $((i - 1)); done
    echo 'x]'
  done; } >laughs.yaml
probe alias-expansion 2 "holds more than 100000 values" -- validate laughs.yaml --no-data
{ cat ok.yaml; echo 'train: {epochs: 5}'; } >dup.yaml
probe duplicate-key 2 "duplicate key 'train'" -- validate dup.yaml --no-data
probe octal-looking-integer 2 "no leading zero" -- validate ok.yaml train.epochs=010 --no-data
probe unknown-command 2 "unknown command 'sweep'" -- sweep ok.yaml
probe unknown-flag 2 "see dtrain run --help" -- run ok.yaml --bogus
probe name-too-long 2 "name" -- validate ok.yaml "name=$(printf 'x%.0s' $(seq 300))"
printf '? [a, b]\n: 1\n' > complex.yaml
probe yaml-complex-key 2 "complex.yaml" -- validate complex.yaml
{ tiny; printf -- '---\nname: second\n'; } > two.yaml
probe yaml-second-document 2 "two.yaml" -- validate two.yaml
{ tiny; printf 'extra: "open\n'; } > quote.yaml
probe yaml-open-quote 2 "quote.yaml" -- validate quote.yaml
probe unknown-key 2 "train.epoch" -- validate ok.yaml train.epoch=3
probe empty-config 0 "holds no settings" -- validate empty.yaml
probe fifo-as-config 2 "not a regular file" -- validate fifo.yaml
probe fifo-as-data 2 "a FIFO (a data file must be a regular file)" -- validate ok.yaml data.dataset=fashion-mnist data.path=fifodata
probe tag-hidden 2 "--tag" -- run ok.yaml --tag .hidden --results res
probe bench-comm-64G 2 "error" -- bench-comm --sizes 64G:64G --out bc

# Strings that reach gnuplot and folder names: nothing may run.
# A name that would close a gnuplot string and run a shell command (gnuplot ends a command at
# ';'; a newline in a name is refused), honest names with quotes.
tiny '"x'"'"'; system \"touch PWNED\"; set title '"'"'"' > inject.yaml
probe injected-name-run 0 "done" -- run inject.yaml --tag a --results res --quiet
probe quoted-name-run 0 "done" -- run ok.yaml "name=bob's sweep" --tag a --results res --quiet
probe injected-name-plots 0 "" -- report res --out rep --plots
must_not_exist injected-name-no-code PWNED
probe injected-out-plots 0 "" -- report res --out "o'\$(touch PWNED2)'" --plots
must_not_exist injected-out-no-code PWNED2

# Control characters in names and tags: refused, no folder made.
tiny '"syn\r"' > cr.yaml
probe name-carriage-return 2 "control characters" -- validate cr.yaml
probe tag-carriage-return 2 "control characters are not allowed in a tag" -- run ok.yaml --tag "$(printf 'a\rb')" --results res

# Run folders and checkpoints.
probe finished-run-kept 2 "already exists" -- run ok.yaml --tag act --results res --quiet
# Files dtrain wrote, replaced by links: never read through, never moved through.
echo "SECRET-LINE" > secret
"$bin" run ok.yaml gpus=1,2 --tag lk --results links --quiet >/dev/null 2>&1
rm -f links/tiny/lk-g1/status && ln -s "$t/secret" links/tiny/lk-g1/status
probe report-status-link 0 "" -- report links --out links-rep
total=$((total + 1))
if grep -rq SECRET-LINE links-rep; then
  failed=$((failed + 1)); printf '| report-status-link-hidden | | | | | FAILED: the secret is in the report |\n'
else
  printf '| report-status-link-hidden | | | | | ok |\n'
fi
DTRAIN_FAULT=0:3 "$bin" run ok.yaml gpus=2 --tag at --results attic --quiet >/dev/null 2>&1
mkdir -p elsewhere && ln -s "$t/elsewhere" attic/tiny/.attempts
probe attempts-link 2+ ".attempts: a symbolic link" -- run ok.yaml gpus=2 --tag at --results attic --resume
# A resume of part of a sweep keeps the other runs in the index (header and two rows).
"$bin" run ok.yaml gpus=1,2 --tag ix --results index --quiet >/dev/null 2>&1
probe index-partial-resume 0 "resume" -- run ok.yaml gpus=2 --tag ix --results index --resume
total=$((total + 1))
if [ "$(wc -l <index/tiny/index-ix.csv)" = 3 ]; then
  printf '| index-keeps-rows | | | | | ok |\n'
else
  failed=$((failed + 1)); printf '| index-keeps-rows | | | | | FAILED: index-ix.csv lost rows |\n'
fi
# A damaged number in metrics.csv: named, not projected.
sed -i '2s/^\(\([^,]*,\)\{11\}\)[^,]*/\1abc/' index/tiny/ix-g1/metrics.csv
probe project-damaged-metrics 2 "'compute_s' is 'abc'" -- project index/tiny/ix-g1
# A run that would take hours, stopped once its first checkpoint is written.
tiny "long" > long.yaml && sed -i 's/epochs: 2/epochs: 100000/' long.yaml
"$bin" run long.yaml --tag busy --results res --quiet >/dev/null 2>&1 & busy=$!
for _ in $(seq 400); do [ -e res/long/busy-g1/checkpoint.bin ] && break; sleep 0.05; done
kill -0 $busy 2>/dev/null || echo "probe: the long run ended early; the next cases will fail"
probe folder-held-by-another 2 "another dtrain process" -- run long.yaml --tag busy --results res --resume
kill -INT $busy; wait $busy; rc=$?
total=$((total + 1))
if [ "$rc" = 130 ] && [ "$(cat res/long/busy-g1/status)" = interrupted ]; then
  printf '| ctrl-c-interrupts | 130 | | | | ok |\n'
else
  failed=$((failed + 1)); printf '| ctrl-c-interrupts | %s | | | | FAILED: not exit 130 and status interrupted |\n' "$rc"
fi
printf 'dtrain checkpoint 1\nnot really' > res/long/busy-g1/checkpoint.bin
probe damaged-checkpoint 2+ "not a usable checkpoint" -- run long.yaml --tag busy --results res --resume
# 6 GB with a valid header (sparse): refused by its size before it is read.
truncate -s 6G res/long/busy-g1/checkpoint.bin
probe checkpoint-6GB 2+ "6442450944 bytes, more than the" -- run long.yaml --tag busy --results res --resume

echo
echo "probe: $((total - failed)) of $total cases as they should be (peak memory <= $max_mib MiB, <= $max_s s each)"
[ "$failed" = 0 ]
