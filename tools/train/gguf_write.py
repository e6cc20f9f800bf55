"""A minimal GGUF (version 3) writer: the metadata and tensor types this trainer needs.

Layout (from the GGUF specification): magic "GGUF", version, tensor count, metadata count, the
metadata key/value pairs, the tensor infos (name, dimensions innermost first, type, offset into
the data section), padding to `general.alignment` (32), then the tensor data, each aligned.
"""
import struct

import numpy as np

GGUF_MAGIC = b"GGUF"
ALIGNMENT = 32

# Metadata value types.
UINT32, INT32, FLOAT32, BOOL, STRING, ARRAY, UINT64 = 4, 5, 6, 7, 8, 9, 10
# Tensor types.
F32, F16 = 0, 1


def _string(s):
    b = s.encode("utf-8")
    return struct.pack("<Q", len(b)) + b


def _value(vtype, v):
    if vtype == UINT32:
        return struct.pack("<I", v)
    if vtype == INT32:
        return struct.pack("<i", v)
    if vtype == UINT64:
        return struct.pack("<Q", v)
    if vtype == FLOAT32:
        return struct.pack("<f", v)
    if vtype == BOOL:
        return struct.pack("<?", v)
    if vtype == STRING:
        return _string(v)
    raise ValueError(f"unsupported metadata type {vtype}")


class GGUFWriter:
    def __init__(self):
        self.kv = []  # (key, bytes of type + value)
        self.tensors = []  # (name, numpy array, ggml type)

    def add(self, key, vtype, value):
        self.kv.append((key, struct.pack("<I", vtype) + _value(vtype, value)))

    def add_array(self, key, elem_type, values):
        body = struct.pack("<I", ARRAY) + struct.pack("<IQ", elem_type, len(values))
        body += b"".join(_value(elem_type, v) for v in values)
        self.kv.append((key, body))

    def add_tensor(self, name, array, ggml_type):
        """`array` in row-major order as PyTorch holds it: shape (rows, cols) is written with
        dimensions (cols, rows), GGUF's innermost-first order."""
        dtype = np.float32 if ggml_type == F32 else np.float16
        self.tensors.append((name, np.ascontiguousarray(array, dtype=dtype), ggml_type))

    def write(self, path):
        header = GGUF_MAGIC + struct.pack("<IQQ", 3, len(self.tensors), len(self.kv))
        header += b"".join(_string(k) + v for k, v in self.kv)
        offset = 0
        infos = b""
        for name, arr, ggml_type in self.tensors:
            dims = list(reversed(arr.shape))
            infos += _string(name) + struct.pack("<I", len(dims))
            infos += b"".join(struct.pack("<Q", d) for d in dims)
            infos += struct.pack("<IQ", ggml_type, offset)
            offset += (arr.nbytes + ALIGNMENT - 1) // ALIGNMENT * ALIGNMENT
        with open(path, "wb") as f:
            f.write(header + infos)
            f.write(b"\0" * (-f.tell() % ALIGNMENT))
            for _, arr, _ in self.tensors:
                f.write(arr.tobytes())
                f.write(b"\0" * (-arr.nbytes % ALIGNMENT))
