#!/usr/bin/env bash
# The documentation keeps its promises: every relative link in README.md and docs/*.md reaches a
# file (and a heading, for a #anchor into Markdown), and every `dtrain` command line in their sh,
# bash and plain code blocks parses with the real binary, its config and overrides accepted by
# `dtrain validate`. The rules, and which lines are skipped, are in docs/development.md ("The
# documentation test"). Usage: docs_test.sh DTRAIN_BINARY
set -euo pipefail
export LC_ALL=C
here=$(cd "$(dirname "$0")/.." && pwd)
[ $# -eq 1 ] || { echo "usage: docs_test.sh DTRAIN_BINARY"; exit 2; }
bin=$(readlink -f "$1")
[ -x "$bin" ] || { echo "docs: no dtrain binary at $1"; exit 2; }
cd "$here"
tmp=$(mktemp -d "${TMPDIR:-/tmp}/dtrain-docs.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
mkdir "$tmp/anchors" "$tmp/help" "$tmp/out"
docs=(README.md docs/*.md)
failed=0 links=0 checked=0 nodata=0 skipped=0
fail() { echo "docs: FAILED: $*"; failed=$((failed + 1)); }
US=$'\037'

# ---- (a) links ----------------------------------------------------------------------------

# Headings and links of one Markdown file, outside code fences: "H<US>text" and
# "L<US>line<US>target". Inline code is dropped before links are looked for.
scan_md() {
  awk -v us="$US" '
    /^[ ]*(```|~~~)/ { fence = !fence; next }
    fence { next }
    /^#+ / { h = $0; sub(/^#+ +/, "", h); sub(/ +#+ *$/, "", h); print "H" us h }
    {
      s = $0
      gsub(/`[^`]*`/, "", s)
      while (match(s, /\]\([^) ]+\)/)) {
        print "L" us NR us substr(s, RSTART + 2, RLENGTH - 3)
        s = substr(s, RSTART + RLENGTH)
      }
    }' "$1"
}

# The anchors GitHub gives a file's headings: link text kept without its target, lowercase,
# punctuation other than '-' and '_' dropped, each space a '-', repeats suffixed -1, -2, ...
anchors_of() {
  local cache
  cache="$tmp/anchors/$(printf '%s' "$1" | tr '/' '%')"
  if [ ! -e "$cache" ]; then
    scan_md "$1" | sed -n "s/^H$US//p" | sed -e 's/\](\([^)]*\))/]/g' | tr '[:upper:]' '[:lower:]' |
      LC_ALL=C sed -e 's/[^a-z0-9 _-]//g' -e 's/ /-/g' |
      awk '{ n = seen[$0]++; print (n ? $0 "-" n : $0) }' >"$cache"
  fi
  cat "$cache"
}

for f in "${docs[@]}"; do
  while IFS="$US" read -r kind line target; do
    [ "$kind" = L ] || continue
    case $target in [a-zA-Z]*:*) continue ;; esac # https:, mailto:: not followed
    links=$((links + 1))
    path=${target%%#*} anchor=""
    [ "$path" != "$target" ] && anchor=${target#*#}
    if [ -z "$path" ]; then
      resolved=$f
    elif [ "${path#/}" != "$path" ]; then
      resolved=${path#/}
    else
      resolved=$(dirname "$f")/$path
      resolved=${resolved#./}
    fi
    if [ ! -e "$resolved" ]; then
      fail "$f:$line: link '$target': no file $resolved"
    elif [ -n "$anchor" ] && [ "${resolved%.md}" != "$resolved" ] &&
      ! anchors_of "$resolved" | grep -qxF -- "$anchor"; then
      fail "$f:$line: link '$target': no heading with anchor #$anchor in $resolved"
    fi
  done < <(scan_md "$f")
done

# ---- (b) dtrain command lines -------------------------------------------------------------

# Command lines of the sh, bash and plain code blocks: "file<US>line<US>expected<US>command".
# A block with "$ " prompts is a transcript: only prompt lines are commands, and when the next
# line is "dtrain: error: ..." that is the expected output. Elsewhere every line is a command.
# Comments are dropped and lines ending in a backslash joined.
extract_commands() {
  awk -v us="$US" -v file="$1" '
    function flush(   i, cmd, at, want) {
      for (i = 1; i <= n; i++) {
        cmd = buf[i]; at = lno[i]
        if (prompt && cmd !~ /^\$ /) continue
        sub(/^\$ /, "", cmd)
        while (cmd ~ /\\$/ && i < n) { sub(/\\$/, "", cmd); cmd = cmd " " buf[++i] }
        want = ""
        if (prompt && i < n && buf[i + 1] ~ /^dtrain: error: /) want = buf[i + 1]
        if (cmd ~ /^[ ]*#/) continue
        sub(/[ \t]+#.*$/, "", cmd)
        if (cmd ~ /[^ ]/) print file us at us want us cmd
      }
      n = 0; prompt = 0
    }
    /^[ ]*```/ {
      if (!fence) {
        lang = $0; sub(/^[ ]*```[ ]*/, "", lang); sub(/[ {].*$/, "", lang)
        fence = 1; take = (lang == "" || lang == "sh" || lang == "bash"); n = 0; prompt = 0
      } else {
        if (take) flush()
        fence = 0
      }
      next
    }
    fence && take { buf[++n] = $0; lno[n] = NR; if ($0 ~ /^\$ /) prompt = 1 }' "$1"
}

help_of() { # the --help text of a subcommand, cached
  local h="$tmp/help/$1"
  [ -e "$h" ] || "$bin" "$1" --help >"$h" 2>&1 </dev/null || true
  cat "$h"
}
# Whether an option of a subcommand takes a value: its help line names a type (TEXT, INT, ...).
takes_value() {
  help_of "$1" | grep -E -- "^ +(-[a-zA-Z],)?$2 [A-Z]+([ =:]|$)" >/dev/null
}
# The data folders of a config and overrides that this machine lacks (synthetic data has none).
missing_data() {
  { "$bin" validate --no-data --print "$@" </dev/null 2>/dev/null || true; } |
    awk '/^  dataset: / { ds = $2 } /^  path: / && ds != "synthetic" { print $2 }' |
    sed -e 's/^"\(.*\)"$/\1/' -e "s/^'\(.*\)'\$/\1/" | sort -u |
    while read -r p; do [ -d "$p" ] || echo "$p"; done
}

subcommands=$("$bin" --help </dev/null | awk '/^Subcommands:/ { s = 1; next } s && NF { print $1 }')
[ -n "$subcommands" ] || { echo "docs: no subcommands in '$bin --help'"; exit 1; }
gpu=0
"$bin" devices --json </dev/null 2>/dev/null | grep -q '"gpus":\[{' && gpu=1

for f in "${docs[@]}"; do extract_commands "$f"; done >"$tmp/commands"

k=0
while IFS="$US" read -r -u 3 f line expect cmd; do
  read -r -a words <<<"$cmd"
  start=-1
  for i in "${!words[@]}"; do
    case ${words[$i]} in dtrain | */dtrain) start=$i; break ;; esac
  done
  [ "$start" -ge 0 ] || continue # not a dtrain line (scripts/..., sbatch, ...)
  args=("${words[@]:start+1}")
  shown="dtrain ${args[*]}"
  where="$f:$line"
  # Placeholders: '...', <...>, $VAR, a|b, or an all-capitals word (CONFIG, N, RUN_DIR, FILE).
  why=""
  case "${args[*]}" in *...* | *'<'* | *'>'* | *'$'* | *'|'*) why=placeholder ;; esac
  if [ -z "$why" ] && printf '%s\n' "${args[@]}" | tr '\133\135 =,:/' '\n\n\n\n\n\n\n' |
    grep -qxE '[A-Z][A-Z0-9_]*'; then
    why=placeholder
  fi
  if [ -z "$why" ] && [ "$gpu" = 0 ] && printf '%s\n' "${args[@]}" | grep -qx 'backend=cuda'; then
    why="needs a GPU"
  fi
  if [ -n "$why" ]; then
    echo "skip ($why): $where: $shown"
    skipped=$((skipped + 1))
    continue
  fi
  [ "${#args[@]}" -gt 0 ] || { fail "$where: '$shown' names no subcommand"; continue; }
  sub=${args[0]}
  k=$((k + 1))
  if [ "${sub#-}" != "$sub" ]; then # dtrain --help, dtrain --version
    "$bin" "${args[@]}" >/dev/null 2>&1 </dev/null || fail "$where: '$shown' exits nonzero"
    checked=$((checked + 1))
    echo "ok: $where: $shown"
    continue
  fi
  if ! grep -qxF -- "$sub" <<<"$subcommands"; then
    fail "$where: '$shown': no subcommand '$sub' in dtrain --help"
    continue
  fi
  # Every option must be one that the subcommand's --help lists; then the real parser.
  bad=""
  pos=() rest=() i=1
  while [ "$i" -lt "${#args[@]}" ]; do
    w=${args[$i]}
    if [ "${w#-}" != "$w" ]; then
      name=${w%%=*}
      help_of "$sub" | grep -qE -- "(^|[ ,])$name([ ,=]|$)" || bad="$bad $name"
      if [ "$w" = "$name" ] && takes_value "$sub" "$name" && [ $((i + 1)) -lt "${#args[@]}" ]; then
        rest+=("$w" "${args[$((i + 1))]}")
        i=$((i + 2))
        continue
      fi
      rest+=("$w")
    else
      pos+=("$w")
    fi
    i=$((i + 1))
  done
  if [ -n "$bad" ]; then
    fail "$where: '$shown': dtrain $sub --help lists no option$bad"
    continue
  fi
  if ! out=$("$bin" "${args[@]}" --help 2>&1 </dev/null); then
    fail "$where: '$shown' does not parse: $(tail -n 1 <<<"$out")"
    continue
  fi
  # What the command does with its arguments, without side effects.
  run=() note=""
  case $sub in
    run | explain) run=(validate "${pos[@]}") ;;
    validate | doctor) run=("${args[@]}") ;;
    report | project)
      run=("$sub") i=0
      while [ "$i" -lt "${#rest[@]}" ]; do
        case ${rest[$i]} in
          --out) i=$((i + 2)); continue ;;
          --out=* | --plots) ;;
          *) run+=("${rest[$i]}") ;;
        esac
        i=$((i + 1))
      done
      run+=("${pos[@]}" --out "$tmp/out/$k")
      ;;
    devices)
      run=(devices)
      for w in "${rest[@]}"; do [ "$w" = --measure ] || run+=("$w"); done
      ;;
  esac
  if [ "${#run[@]}" -gt 0 ] && { [ "${run[0]}" = validate ] || [ "${run[0]}" = doctor ]; } &&
    [ "${#pos[@]}" -gt 0 ] && ! printf '%s\n' "${run[@]}" | grep -qx -- --no-data; then
    lacking=$(missing_data "${pos[@]}" | tr '\n' ' ')
    if [ -n "$lacking" ]; then
      run+=(--no-data)
      note=" (without data: no ${lacking% })"
      nodata=$((nodata + 1))
    fi
  fi
  rc=0
  if [ "${#run[@]}" -gt 0 ]; then
    out=$("$bin" "${run[@]}" 2>&1 </dev/null) || rc=$?
  fi
  if [ -n "$expect" ]; then
    if [ "$rc" != 2 ]; then
      fail "$where: '$shown' should fail with exit 2 and '$expect'; 'dtrain ${run[*]}' exited $rc"
      continue
    elif ! grep -qxF -- "$expect" <<<"$out"; then
      fail "$where: '$shown' now says: $(grep 'dtrain: error' <<<"$out" | head -n 1)"
      continue
    fi
  elif [ "$rc" != 0 ]; then
    fail "$where: '$shown': 'dtrain ${run[*]}' exited $rc: $(grep -m 1 'error' <<<"$out" || tail -n 1 <<<"$out")"
    continue
  fi
  checked=$((checked + 1))
  echo "ok: $where: $shown$note"
done 3<"$tmp/commands"

echo "docs: ${#docs[@]} files, $links links; $checked command lines checked ($nodata without data), $skipped skipped; $failed failed"
[ "$checked" -gt 0 ] || { echo "docs: FAILED: no command line was checked"; exit 1; }
[ "$failed" -eq 0 ]
