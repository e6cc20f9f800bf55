#!/usr/bin/env bash
# Installs what the evaluation-model trainer needs, from Debian's packages (Debian 12 / bookworm):
# PyTorch (CPU) and SentencePiece; OpenBLAS, which Debian's alternatives then give PyTorch in
# place of the reference BLAS (about 40x faster training here); the text it trains on: the World
# English Bible and the King James Version as SWORD modules with diatheke to export them, and the
# fortune databases.
set -euo pipefail
packages=(python3 python3-numpy python3-torch python3-sentencepiece libopenblas0-pthread
  sword-text-web sword-text-kjv diatheke fortunes fortunes-min)
exec "$(dirname "$0")/../../scripts/apt-install.sh" tools/train/install-deps "${packages[@]}"
