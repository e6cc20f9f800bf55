#!/usr/bin/env bash
# Creates a seed corpus for grammar_fuzz: the GBNF grammars and JSON Schemas of the unit tests
# (tests/grammar/*.cc keep them as raw string literals R"(...)"), each behind the byte that makes
# grammar_fuzz read it as GBNF (0x00) or as a schema (0x01).
#
#   fuzz/make_grammar_corpus.sh OUT_DIR
#   build-fuzz/fuzz/grammar_fuzz -max_total_time=60 -dict=fuzz/grammar.dict OUT_DIR
set -euo pipefail
out=${1:?usage: fuzz/make_grammar_corpus.sh OUT_DIR}
mkdir -p "$out"
python3 - "$out" "$(dirname "$0")"/../tests/grammar/*.cc <<'PY'
import json, re, sys

out, sources = sys.argv[1], sys.argv[2:]
n = 0
for path in sources:
    for literal in re.findall(r'R"\((.*?)\)"', open(path).read(), re.S):
        text = literal.strip()
        if "::=" in text:
            kind = b"\x00"
        else:
            try:
                json.loads(text)
            except ValueError:
                continue
            kind = b"\x01"
        with open(f"{out}/seed{n:03d}", "wb") as f:
            f.write(kind + text.encode())
        n += 1
print(f"{n} seeds in {out}")
PY
