#!/usr/bin/env bash
# Installs the Debian packages named after TAG that are not installed yet (apt-get, with sudo
# when not root); prints TAG's summary either way. Shared by scripts/install-deps.sh and
# tools/train/install-deps.sh.
#   scripts/apt-install.sh TAG PACKAGE...
set -euo pipefail
tag=$1
shift
missing=()
for p in "$@"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "$tag: all $# packages present"
  exit 0
fi
sudo_cmd=()
[ "$(id -u)" -ne 0 ] && sudo_cmd=(sudo)
echo "$tag: installing ${missing[*]}"
"${sudo_cmd[@]}" apt-get update -qq
DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
