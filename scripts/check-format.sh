#!/usr/bin/env bash
# Checks, without changing anything, that every tracked C++ file (*.cc, *.h) is formatted as
# .clang-format says: prints the files clang-format would change and exits 1 if there are any.
#   scripts/check-format.sh          check
#   scripts/check-format.sh --fix    format those files in place
# CLANG_FORMAT names another binary (default: clang-format, which scripts/install-deps.sh installs).
set -euo pipefail
cd "$(dirname "$0")/.."

fix=0
case "${1:-}" in
  "") ;;
  --fix) fix=1 ;;
  *)
    echo "usage: scripts/check-format.sh [--fix]" >&2
    exit 2
    ;;
esac
clang_format=${CLANG_FORMAT:-clang-format}
if ! command -v "$clang_format" > /dev/null; then
  echo "check-format: $clang_format not found (scripts/install-deps.sh installs it)" >&2
  exit 2
fi

mapfile -t files < <(git ls-files '*.cc' '*.h')
unformatted=()
for f in "${files[@]}"; do
  [ -f "$f" ] || continue  # deleted in the work tree, not yet in the index
  if ! out=$("$clang_format" --dry-run --Werror "$f" 2>&1); then
    # Anything but a formatting difference (a bad .clang-format, an unreadable file) is an error.
    if [[ "$out" != *"-Wclang-format-violations"* ]]; then
      echo "check-format: $clang_format failed on $f:" >&2
      echo "$out" >&2
      exit 2
    fi
    unformatted+=("$f")
  fi
done

if [ ${#unformatted[@]} -eq 0 ]; then
  echo "check-format: all ${#files[@]} files formatted"
  exit 0
fi
printf '%s\n' "${unformatted[@]}"
if [ "$fix" -eq 1 ]; then
  "$clang_format" -i "${unformatted[@]}"
  echo "check-format: formatted ${#unformatted[@]} of ${#files[@]} files"
  exit 0
fi
echo "check-format: ${#unformatted[@]} of ${#files[@]} files need formatting" \
  "(scripts/check-format.sh --fix formats them)" >&2
exit 1
