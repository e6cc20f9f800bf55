#!/bin/bash
# Seed corpus for safetensors_fuzz: small .safetensors files in the shapes hf/safetensors.cc
# reads (8-byte little-endian header length, JSON header, tensor bytes): two tensors of
# different dtypes with metadata, one empty tensor, and a header padded with spaces.
# Usage: fuzz/make_safetensors_corpus.sh DIR
set -euo pipefail
out=$1
mkdir -p "$out"

# write FILE HEADER DATA_BYTES: the header's length as 8 little-endian bytes, the header, then
# DATA_BYTES bytes of a repeating pattern.
write() {
  local file=$1 header=$2 data_bytes=$3 n i
  n=${#header}
  {
    for i in 0 1 2 3 4 5 6 7; do
      printf "\\$(printf '%03o' $(((n >> (8 * i)) & 255)))"
    done
    printf '%s' "$header"
    head -c "$data_bytes" /dev/zero | tr '\0' '\101'
  } > "$out/$file"
}

write two_tensors.safetensors \
  '{"__metadata__":{"format":"pt"},"a.weight":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]},"b.bias":{"dtype":"BF16","shape":[4],"data_offsets":[24,32]}}' \
  32
write empty_tensor.safetensors \
  '{"e":{"dtype":"F16","shape":[0,8],"data_offsets":[0,0]},"x":{"dtype":"I64","shape":[1],"data_offsets":[0,8]}}' \
  8
write padded_header.safetensors \
  '{"w":{"dtype":"F16","shape":[2,2],"data_offsets":[0,8]}}        ' \
  8
