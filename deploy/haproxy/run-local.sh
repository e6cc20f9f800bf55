#!/usr/bin/env bash
# N `sieve serve` replicas behind HAProxy on loopback, each replica restarted when it exits (as a
# Kubernetes Deployment would); Ctrl-C (or SIGTERM) drains and stops them all.
#
#   deploy/haproxy/run-local.sh -m MODEL.gguf [-n 3] [-p 8080] [--prefix-affinity] [-- more sieve serve options]
#
# --prefix-affinity sends requests whose prompts start alike to the same replica (haproxy.cfg
# says how), so that groups of requests sharing a system prompt hit one replica's prefix cache.
#
# HAProxy listens on 127.0.0.1:PORT, the replicas on PORT+1 .. PORT+N. Pid files and logs go to
# $SIEVE_RUN_DIR (default: a new temporary folder). A rolling restart by hand:
#   for f in $SIEVE_RUN_DIR/replica-*.pid; do kill -TERM "$(cat "$f")"; sleep 10; done
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
sieve=${SIEVE_BIN:-$root/build/sieve}
model=""
replicas=3
port=8080
affinity=0
while [ $# -gt 0 ]; do
  case "$1" in
    -m) model=$2; shift 2 ;;
    -n) replicas=$2; shift 2 ;;
    -p) port=$2; shift 2 ;;
    --prefix-affinity) affinity=1; shift ;;
    --) shift; break ;;
    *) echo "usage: $0 -m MODEL.gguf [-n REPLICAS] [-p PORT] [--prefix-affinity] [-- sieve serve options]" >&2; exit 2 ;;
  esac
done
[ -n "$model" ] || { echo "$0: -m MODEL.gguf is required" >&2; exit 2; }
[ -x "$sieve" ] || { echo "$0: no sieve binary at $sieve (scripts/build.sh, or set SIEVE_BIN)" >&2; exit 1; }
command -v haproxy > /dev/null || { echo "$0: haproxy is not installed (scripts/install-deps.sh)" >&2; exit 1; }
run_dir=${SIEVE_RUN_DIR:-$(mktemp -d -t sieve-replicas.XXXXXX)}
mkdir -p "$run_dir"

addresses=()
for i in $(seq 1 "$replicas"); do addresses+=("127.0.0.1:$((port + i))"); done
affinity_flag=()
[ "$affinity" -eq 1 ] && affinity_flag=(--prefix-affinity)
"$here/render-config.sh" "${affinity_flag[@]}" "${addresses[@]}" > "$run_dir/haproxy.cfg"
export SIEVE_LB_ADDR=127.0.0.1 SIEVE_LB_PORT=$port
haproxy -c -q -f "$run_dir/haproxy.cfg"

stopping=0
supervisors=()
# Runs replica $1 on port $2 until the script stops, starting it again whenever it exits.
supervise() {
  local i=$1 p=$2
  shift 2
  trap 'stopping=1; [ -f "$run_dir/replica-$i.pid" ] && kill -TERM "$(cat "$run_dir/replica-$i.pid")" 2>/dev/null || true' TERM
  while [ "$stopping" -eq 0 ]; do
    "$sieve" serve -m "$model" --host 127.0.0.1 --port "$p" "$@" >> "$run_dir/replica-$i.log" 2>&1 &
    echo $! > "$run_dir/replica-$i.pid"
    wait $! || true   # returns early when the trap runs; the replica is draining then
    wait "$(cat "$run_dir/replica-$i.pid")" 2>/dev/null || true
    [ "$stopping" -eq 0 ] && echo "replica-$i exited; starting it again" >&2
  done
}
for i in $(seq 1 "$replicas"); do
  supervise "$i" "$((port + i))" "$@" &
  supervisors+=($!)
done
haproxy -W -db -f "$run_dir/haproxy.cfg" >> "$run_dir/haproxy.log" 2>&1 &
haproxy_pid=$!
stop() {
  trap - INT TERM
  for s in "${supervisors[@]}"; do kill -TERM "$s" 2>/dev/null || true; done
  wait "${supervisors[@]}" 2>/dev/null || true
  kill -TERM "$haproxy_pid" 2>/dev/null || true
  wait "$haproxy_pid" 2>/dev/null || true
}
trap 'stop; exit 0' INT TERM
echo "HAProxy: http://127.0.0.1:$port/v1 -> $replicas replicas on ports $((port + 1))-$((port + replicas))"
echo "logs and pid files: $run_dir"
wait "$haproxy_pid"
stop
