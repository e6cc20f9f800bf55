#!/usr/bin/env bash
# Installs dependencies and builds sieve (Release) into build/: by default only the `sieve`
# binary and the libraries it links, so a fresh clone serves in minutes; name other targets to
# build them too (e.g. `scripts/build.sh all`, or `kernels_test`). scripts/test.sh builds
# everything.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
# The web page's libraries (bundled into the binary) from npm, as the lock file pins them: only
# when missing or older than the lock file.
if [ ! -f webui/node_modules/.package-lock.json ] ||
  [ webui/package-lock.json -nt webui/node_modules/.package-lock.json ]; then
  npm ci --prefix webui --no-audit --no-fund --loglevel=error
fi
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(sieve)
cmake --build build -j"$(nproc)" --target "${targets[@]}"
