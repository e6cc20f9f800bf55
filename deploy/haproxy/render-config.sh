#!/usr/bin/env bash
# Prints deploy/haproxy/haproxy.cfg with one server line per replica address, and with prefix
# affinity in place of leastconn when asked (the "#affinity" lines of haproxy.cfg):
#   deploy/haproxy/render-config.sh [--prefix-affinity] HOST:PORT [HOST:PORT ...] > haproxy.cfg
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
affinity=0
if [ "${1:-}" = --prefix-affinity ]; then affinity=1; shift; fi
[ $# -gt 0 ] || { echo "usage: $0 [--prefix-affinity] HOST:PORT [HOST:PORT ...]" >&2; exit 2; }
servers=""
i=0
for address in "$@"; do
  i=$((i + 1))
  servers+="    server replica-$i $address"$'\n'
done
awk -v servers="$servers" -v affinity="$affinity" '
  /^@SERVERS@$/ { printf "%s", servers; next }
  affinity && /^ *balance leastconn$/ { next }
  affinity { sub(/^ *#affinity /, "    ") }
  { print }' "$here/haproxy.cfg"
