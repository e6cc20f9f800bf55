#!/usr/bin/env bash
# Creates a seed corpus for gguf_fuzz from ../shared, so that no binary seeds are committed.
#
#   fuzz/make_corpus.sh OUT_DIR [SHARED_DIR]
#   build-fuzz/fuzz/gguf_fuzz -max_total_time=60 -max_len=65536 OUT_DIR
#
# Seeds: the real model (valid), its header with no tensors (valid, small), the first 4 KiB of
# each vocab file (truncated mid-array), a small synthetic file that holds every value type,
# nested arrays and a few tensors (valid), so mutations start from files the reader accepts;
# and llama.cpp's files of golden/quant that model loading must handle: K-quant mixes (Q4_K_M,
# Q6_K, Q2_K with Q3_K/Q4_K/Q6_K), tied-embedding Qwen2 Q4_K_M, IQ4_XS, and TQ2_0 (a type sieve
# refuses at load).
set -euo pipefail

if [[ $# -lt 1 ]]; then
  echo "usage: $0 OUT_DIR [SHARED_DIR]" >&2
  exit 2
fi
out=$1
here=$(cd "$(dirname "$0")" && pwd)
shared=${2:-${SIEVE_SHARED_DIR:-$here/../../shared}}
mkdir -p "$out"

model="$shared/models/stories260K.gguf"
[[ -f $model ]] || { echo "missing $model" >&2; exit 1; }
install -m 0644 "$model" "$out/stories260K.gguf"
for quant in base-Q4_K_M base-Q6_K base-Q2_K base-IQ4_XS base-TQ2_0 arch-qwen2-Q4_K_M; do
  file="$shared/golden/quant/$quant.gguf"
  [[ -f $file ]] || { echo "missing $file" >&2; exit 1; }
  install -m 0644 "$file" "$out/$quant.gguf"
done
for vocab in "$shared"/golden/tokenizer/*.gguf; do
  head -c 4096 "$vocab" > "$out/$(basename "$vocab" .gguf)-4k.gguf"
done

python3 - "$model" "$out" <<'EOF'
import struct, sys

model, out = sys.argv[1], sys.argv[2]

# stories260K's metadata alone: tensor count 0, cut where its tensor infos begin.
data = bytearray(open(model, "rb").read())
(num_kvs,) = struct.unpack_from("<Q", data, 16)
sizes = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}

def skip_value(pos, vtype):
    if vtype == 8:
        (n,) = struct.unpack_from("<Q", data, pos)
        return pos + 8 + n
    if vtype == 9:
        etype, n = struct.unpack_from("<IQ", data, pos)
        pos += 12
        for _ in range(n):
            pos = skip_value(pos, etype)
        return pos
    return pos + sizes[vtype]

pos = 24
for _ in range(num_kvs):
    (n,) = struct.unpack_from("<Q", data, pos)
    pos += 8 + n
    (vtype,) = struct.unpack_from("<I", data, pos)
    pos = skip_value(pos + 4, vtype)
struct.pack_into("<Q", data, 8, 0)
open(f"{out}/stories260K-metadata.gguf", "wb").write(data[:pos])

# A small file with every value type, nested arrays and tensors of several types.
def string(s):
    b = s.encode()
    return struct.pack("<Q", len(b)) + b

def kv(key, vtype, payload):
    return string(key) + struct.pack("<I", vtype) + payload

def array(etype, payloads):
    return struct.pack("<IQ", etype, len(payloads)) + b"".join(payloads)

kvs = [
    kv("u8", 0, struct.pack("<B", 200)), kv("i8", 1, struct.pack("<b", -3)),
    kv("u16", 2, struct.pack("<H", 60000)), kv("i16", 3, struct.pack("<h", -300)),
    kv("u32", 4, struct.pack("<I", 7)), kv("i32", 5, struct.pack("<i", -1)),
    kv("f32", 6, struct.pack("<f", 0.5)), kv("bool", 7, b"\x01"),
    kv("str", 8, string("hello")), kv("u64", 10, struct.pack("<Q", 1 << 40)),
    kv("i64", 11, struct.pack("<q", -(1 << 40))), kv("f64", 12, struct.pack("<d", 1e-5)),
    kv("general.alignment", 4, struct.pack("<I", 32)),
    kv("strs", 9, array(8, [string("a"), string("bc")])),
    kv("i32s", 9, array(5, [struct.pack("<i", v) for v in (1, -2, 3)])),
    kv("f32s", 9, array(6, [struct.pack("<f", v) for v in (0.25, -1.0)])),
    kv("nested", 9, array(9, [array(0, [b"\x01", b"\x02"]), array(8, [string("x")])])),
]
# (name, dims, ggml type, bytes): F32 [4], F16 [8 2], Q8_0 [32], Q4_0 [32 2], Q4_K [256]
tensors = [("a", (4,), 0, 16), ("b", (8, 2), 1, 32), ("c", (32,), 8, 34),
           ("d", (32, 2), 2, 36), ("e", (256,), 12, 144)]
infos, blobs, offset = b"", b"", 0
for i, (name, dims, ttype, nbytes) in enumerate(tensors):
    infos += string(name) + struct.pack("<I", len(dims))
    infos += b"".join(struct.pack("<Q", d) for d in dims) + struct.pack("<IQ", ttype, offset)
    blob = bytes((i * 37 + j) & 0xFF for j in range(nbytes))
    blob += b"\0" * (-len(blob) % 32)
    blobs += blob
    offset += len(blob)
header = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(kvs)) + b"".join(kvs) + infos
header += b"\0" * (-len(header) % 32)
open(f"{out}/synthetic.gguf", "wb").write(header + blobs)
EOF

ls -l "$out"
