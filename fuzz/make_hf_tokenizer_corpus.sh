#!/bin/bash
# Seed corpus for hf_tokenizer_fuzz: two small tokenizer.json files (byte-level BPE with GPT-2's
# pre-tokenizer, and a SentencePiece-style BPE with byte fallback), the shapes hf/hf_tokenizer.cc
# reads. Usage: fuzz/make_hf_tokenizer_corpus.sh DIR
set -euo pipefail
out=$1
mkdir -p "$out"
cat > "$out/byte_level.json" <<'JSON'
{"version": "1.0", "normalizer": null,
 "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "use_regex": true},
 "post_processor": null, "decoder": {"type": "ByteLevel"},
 "added_tokens": [{"id": 10, "content": "<s>", "special": true},
                  {"id": 11, "content": "</s>", "special": true}],
 "model": {"type": "BPE", "vocab": {"h": 0, "e": 1, "l": 2, "o": 3, "Ġ": 4, "w": 5, "he": 6,
                                    "ll": 7, "hell": 8, "hello": 9},
           "merges": ["h e", ["l", "l"], "he ll", "hell o"]}}
JSON
cat > "$out/spm_bpe.json" <<'JSON'
{"version": "1.0",
 "normalizer": {"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": "▁"},
                                                     {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}]},
 "pre_tokenizer": null, "post_processor": null,
 "decoder": {"type": "Sequence", "decoders": [{"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
                                              {"type": "ByteFallback"}, {"type": "Fuse"},
                                              {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
 "added_tokens": [{"id": 0, "content": "<unk>", "special": true},
                  {"id": 1, "content": "<s>", "special": true},
                  {"id": 2, "content": "</s>", "special": true}],
 "model": {"type": "BPE", "byte_fallback": true, "unk_token": "<unk>",
           "vocab": {"<unk>": 0, "<s>": 1, "</s>": 2, "<0x41>": 3, "▁": 4, "h": 5, "i": 6, "▁h": 7, "▁hi": 8},
           "merges": ["▁ h", "▁h i"]}}
JSON
