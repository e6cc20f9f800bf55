#!/usr/bin/env bash
# Resource use of `sieve serve` at rest: the time from exec to the first /health 200 (polled
# every 10 ms), then, after 2 s idle, the server's RSS (VmRSS) and thread count from
# /proc/PID/status. Stops the server.
#   bench/idle_server.sh [MODEL.gguf] [extra serve args...]
# MODEL defaults to ../shared/models/stories260K.gguf; SIEVE=path/to/sieve picks the binary.
set -euo pipefail
cd "$(dirname "$0")/.."
model=${1:-../shared/models/stories260K.gguf}
shift $(($# > 0 ? 1 : 0))
sieve=${SIEVE:-build/sieve}
port=${PORT:-$((20000 + RANDOM % 20000))}
log=$(mktemp)
trap 'kill -TERM "$server" 2> /dev/null || true; wait "$server" 2> /dev/null || true; rm -f "$log"' EXIT

start_ns=$(date +%s%N)
"$sieve" serve -m "$model" --port "$port" "$@" 2> "$log" &
server=$!
ready_ns=
for _ in $(seq 3000); do
  if [ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$port/health")" = 200 ]; then
    ready_ns=$(date +%s%N)
    break
  fi
  kill -0 "$server" 2> /dev/null || break
  sleep 0.01
done
if [ -z "$ready_ns" ]; then
  cat "$log" >&2
  echo "error: /health never answered 200" >&2
  exit 1
fi
sleep 2
status=/proc/$server/status
rss_kib=$(awk '/^VmRSS:/ {print $2}' "$status")
threads=$(awk '/^Threads:/ {print $2}' "$status")
echo "model:               $model"
echo "start to /health 200: $(((ready_ns - start_ns) / 1000000)) ms"
echo "idle RSS:            $((rss_kib / 1024)) MiB ($rss_kib kB)"
echo "threads:             $threads"
grep -o 'KV cache: .*' "$log" | sed 's/^/server log:          /'
