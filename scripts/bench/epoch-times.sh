# Sourced by the cost benchmarks that compare two settings by their median epoch time.
# steady_epoch_times FILE...: epoch_time_s of every epoch but the first of each metrics.csv
# given, one per line, sorted; median: the median of the numbers on stdin.
steady_epoch_times() {
  for f in "$@"; do
    awk -F, 'NR == 1 { for (i = 1; i <= NF; i++) if ($i == "epoch_time_s") c = i; next }
             NR > 2 { print $c }' "$f"
  done | sort -g
}
median() { awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
