#!/usr/bin/env bash
# Installs what the evaluation-model trainer needs, from Debian's packages (Debian 12 / bookworm):
# PyTorch (CPU) and SentencePiece; OpenBLAS, which Debian's alternatives then give PyTorch in
# place of the reference BLAS (about 40x faster training here); the text it trains on: the World
# English Bible and the King James Version as SWORD modules with diatheke to export them, and the
# fortune databases.
set -euo pipefail
packages=(python3 python3-numpy python3-torch python3-sentencepiece libopenblas0-pthread
  sword-text-web sword-text-kjv diatheke fortunes fortunes-min)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "tools/train/install-deps: all ${#packages[@]} packages present"
  exit 0
fi
sudo_cmd=()
[ "$(id -u)" -ne 0 ] && sudo_cmd=(sudo)
echo "tools/train/install-deps: installing ${missing[*]}"
"${sudo_cmd[@]}" apt-get update -qq
DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
