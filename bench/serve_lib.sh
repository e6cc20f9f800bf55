# Sourced by the serving benchmarks: start_server MODEL [serve args...] starts `sieve serve` on a
# free loopback port, waits until /health says ready, and sets $server (pid) and $port.
# stop_server ends it. $sieve is the binary (default build/sieve).
sieve=${SIEVE:-build/sieve}

start_server() {
  local model=$1
  shift
  server_log=$(mktemp)
  "$sieve" serve -m "$model" --port 0 "$@" 2> "$server_log" &
  server=$!
  port=
  for _ in $(seq 600); do
    port=$(sed -n 's/.*listening on http:\/\/127\.0\.0\.1:\([0-9]*\).*/\1/p' "$server_log")
    [ -n "$port" ] && curl -sf "http://127.0.0.1:$port/health" > /dev/null && return 0
    kill -0 "$server" 2> /dev/null || break
    sleep 0.1
  done
  cat "$server_log" >&2
  return 1
}

stop_server() {
  kill -TERM "$server" 2> /dev/null || true
  wait "$server" 2> /dev/null || true
  rm -f "$server_log"
}
