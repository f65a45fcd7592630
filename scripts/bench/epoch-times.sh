# Sourced by the cost benchmarks that compare two settings by their median epoch time.
# steady_epoch_times FILE...: epoch_time_s of every epoch but the first of each metrics.csv
# given, one per line, sorted; median: the median of the numbers on stdin.
steady_epoch_times() {
  for f in "$@"; do
    awk -F, 'NR == 1 { for (i = 1; i <= NF; i++) if ($i == "epoch_time_s") c = i; next }
             NR > 2 { print $c }' "$f"
  done | sort -g
}
# peaks FILE...: peak_rss_mib of each run's summary.json given, one per line, sorted.
peaks() {
  for f in "$@"; do
    python3 -c 'import json,sys; print(round(json.load(open(sys.argv[1]))["peak_rss_mib"]))' "$f"
  done | sort -g
}
# last_losses FILE: the last epoch's train_loss and test_loss of a metrics.csv (the A/B scripts
# check that both settings end a run with the same ones).
last_losses() {
  awk -F, 'NR == 1 { for (i = 1; i <= NF; i++) { if ($i == "train_loss") a = i; if ($i == "test_loss") b = i }; next }
           { v = $a " " $b } END { print v }' "$1"
}
median() { awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
# check_rounds_epochs NAME ROUNDS EPOCHS: one line and exit 2 unless both are whole numbers,
# ROUNDS at least 1 and EPOCHS at least 2 (the first epoch of a run is dropped as warm-up).
check_rounds_epochs() {
  case "$2$3" in *[!0-9]*) echo "$1: ROUNDS and EPOCHS are whole numbers"; exit 2 ;; esac
  [ "$2" -ge 1 ] || { echo "$1: ROUNDS must be at least 1"; exit 2; }
  [ "$3" -ge 2 ] || { echo "$1: EPOCHS must be at least 2 (the first is dropped)"; exit 2; }
}
