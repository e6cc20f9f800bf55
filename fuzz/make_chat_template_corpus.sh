#!/usr/bin/env bash
# Creates a seed corpus for chat_template_fuzz: the real templates the unit test holds
# (tests/server/chat_template_test.cc keeps them as the JSON strings of tokenizer_config.json).
#
#   fuzz/make_chat_template_corpus.sh OUT_DIR
#   build-fuzz/fuzz/chat_template_fuzz -max_total_time=60 -max_len=8192 OUT_DIR
set -euo pipefail

if [[ $# -ne 1 ]]; then
  echo "usage: $0 OUT_DIR" >&2
  exit 2
fi
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$1"
python3 - "$here/../tests/server/chat_template_test.cc" "$1" <<'PY'
import json, re, sys

source, out = open(sys.argv[1]).read(), sys.argv[2]
# Each template is `const char* const k_NAME =` followed by adjacent R"tpl(...)tpl" pieces.
for m in re.finditer(r'const char\* const k_(\w+) =((?:\s*R"tpl\(.*?\)tpl")+);', source, re.S):
    pieces = re.findall(r'R"tpl\((.*?)\)tpl"', m.group(2), re.S)
    with open(f"{out}/{m.group(1)}.jinja", "w") as f:
        f.write(json.loads("".join(pieces)))
PY
ls "$1"
