#!/usr/bin/env bash
# Soak of `sieve serve` (issue 15): starts the server on MODEL, runs `sieve soak` with abuse and
# then without (same duration, same seed, same server), samples the server's RSS at the start,
# every RSS_INTERVAL seconds and at the end of each run, reads the KV pages in use from /metrics
# after each run, checks that the server is still alive, and prints one report.
#   bench/soak.sh [MODEL.gguf] [extra serve args...]
# MODEL defaults to ../shared/models/stories260K.gguf. Knobs (environment):
#   DURATION=60      seconds of load per run (a person: 600 or more)
#   CLIENTS=64  SLOW_LORIS=32  SLOW_READERS=4  SEED=0  RSS_INTERVAL=60
#   SOAK_ARGS=...    more `sieve soak` flags;  OUT=DIR keeps the JSON reports;  SIEVE=path/to/sieve
#   SIEVE_SERVE=path/to/sieve   the server's binary when it is another build (e.g. main's)
# Exits non-zero when the server died, KV pages were in use after a run, a completed greedy
# request differed from the same request served alone, or a normal request failed (5xx,
# connection error, broken stream); 429 and 503 under load are counted, not failures (see
# src/loadgen/soak.h).
set -uo pipefail
cd "$(dirname "$0")/.."
model=${1:-../shared/models/stories260K.gguf}
shift $(($# > 0 ? 1 : 0))
duration=${DURATION:-60}
rss_interval=${RSS_INTERVAL:-60}
out=${OUT:-$(mktemp -d)}
mkdir -p "$out"
source bench/serve_lib.sh
soak_sieve=$sieve
sieve=${SIEVE_SERVE:-$sieve}
start_server "$model" "$@" || { echo "error: the server did not start" >&2; exit 1; }
sieve=$soak_sieve
trap 'kill "$sampler" 2> /dev/null; stop_server' EXIT
url=http://127.0.0.1:$port
t0=$(date +%s)

rss_mib() { awk '/^VmRSS:/ {printf "%.1f", $2 / 1024}' "/proc/$server/status" 2> /dev/null; }
rss_sample() { echo "$(($(date +%s) - t0)) $(rss_mib) $1" >> "$out/rss.txt"; }
pages_in_use() {
  curl -s --max-time 10 "$url/metrics" | awk '/^sieve:kv_pages_used[{ ]/ {s += $NF} END {print s + 0}'
}
alive() { kill -0 "$server" 2> /dev/null; }

: > "$out/rss.txt"
rss_sample start
(while sleep "$rss_interval"; do rss_sample sample; done) &
sampler=$!

failed=0
declare -A rc pages
for abuse in on off; do
  echo "=== sieve soak --abuse $abuse --duration $duration ==="
  "$sieve" soak --base-url "$url" --duration "$duration" --clients "${CLIENTS:-64}" \
    --abuse "$abuse" --slow-loris "${SLOW_LORIS:-32}" --slow-readers "${SLOW_READERS:-4}" \
    --seed "${SEED:-0}" --out "$out/soak-$abuse.json" ${SOAK_ARGS:-}
  rc[$abuse]=$?
  rss_sample "end-of-abuse-$abuse"
  if ! alive; then
    echo "error: the server died during the run with abuse $abuse; its log:" >&2
    tail -n 40 "$server_log" >&2
    exit 1
  fi
  pages[$abuse]=$(pages_in_use)
  [ "${rc[$abuse]}" = 0 ] && [ "${pages[$abuse]}" = 0 ] || failed=1
  echo
done
kill "$sampler" 2> /dev/null
rss_sample end

field() { jq -r "$2" "$out/soak-$1.json" 2> /dev/null || echo "?"; }
echo "=== soak report: $model, ${duration} s per run, seed ${SEED:-0} ==="
for abuse in on off; do
  echo "abuse $abuse: exit ${rc[$abuse]}; KV pages in use after: ${pages[$abuse]};" \
    "greedy $(field "$abuse" .greedy_mismatches) of $(field "$abuse" .greedy_checked) differ;" \
    "normal failures $(field "$abuse" .normal_failures)"
  echo "  outcomes: $(field "$abuse" '[.outcomes | to_entries[] | .key as $k |
    (.value | to_entries[] | "\($k)/\(.key)=\(.value)")] | join(", ")')"
done
echo "server RSS (s since start, MiB, when):"
sed 's/^/  /' "$out/rss.txt"
awk '$3 == "end-of-abuse-on" {w = $2} $3 == "end" {e = $2}
     END {if (w > 0) printf "RSS after warm-up (end of the abuse run) to the end: %.1f -> %.1f MiB (%+.1f%%)\n",
          w, e, 100 * (e - w) / w}' "$out/rss.txt"
ttft() { jq -r ".normal_ttft.$2 * 10 | round / 10" "$out/soak-$1.json" 2> /dev/null; }
for p in p50 p99; do
  with=$(ttft on "${p}_ms") without=$(ttft off "${p}_ms")
  ratio=$(awk -v a="$with" -v b="$without" 'BEGIN {if (b > 0) printf "%.2f", a / b; else print "?"}')
  echo "normal TTFT $p: $with ms with abuse, $without ms without (ratio $ratio)"
done
echo "server alive at the end: $(alive && echo yes || echo NO)"
echo "reports: $out/soak-on.json $out/soak-off.json"
if [ "$failed" = 0 ] && alive; then echo "result: PASS"; else echo "result: FAIL"; exit 1; fi
