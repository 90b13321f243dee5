"""An independent GGUF reader, writer and dequantizer in Python and NumPy, to check rlx's C
GGUF support against: it was written from the format's public description, not from rlx's code.

Sources (by name):
- the GGUF specification in ggml's docs/gguf.md (version 3): header = magic "GGUF", u32 version,
  u64 tensor count, u64 metadata count; metadata values typed by a u32 (0..12); strings are a
  u64 byte length and UTF-8 bytes without a terminator; arrays are a u32 element type, a u64
  count and the elements; tensor infos are name, u32 n_dims, u64 dims (ne0 first, the fastest
  varying), u32 ggml type, u64 offset relative to the data section; the data section starts at
  the end of the tensor infos rounded up to `general.alignment` (u32, default 32), and every
  offset must be a multiple of it. Version 2 has the same layout as 3 (3 only added big-endian
  files, which cannot be told apart and are not supported here); version 1 had 32-bit counts.
- the comments at the top of ggml's gguf.h (the same layout, bools stored as one byte).
- ggml's ggml-common.h block structs and ggml-quants.c reference dequantizers
  (dequantize_row_q4_0 ... dequantize_row_q6_K, get_scale_min_k4) for the block layouts and the
  order of float operations. Results are meant to be bit-identical to those C functions when the
  C compiler does not fuse a multiply and an add (Q4_1, Q5_1 and the K types compute a*b+c or
  a*b-c; a build with -ffp-contract=fast and FMA hardware may differ by one rounding there).

Besides read() and dequantize(): write() (a GGUF writer, with knobs for crafting broken files),
quantize() (ggml's simple reference quantizers Q4_0/Q4_1/Q5_0/Q5_1/Q8_0, byte-exact with
llama.cpp's on the Q4_0 and Q8_0 files tested), quant_grid() (the values a block's scales allow,
for error bounds) and check_model() (qwen3-level checks: architecture, hyperparameters, tensor
names and shapes; llama.cpp spells the key qwen3.feed_forward_length, not the spec's
feedforward_length).

Only the tensor types listed in DEQUANTIZABLE can be dequantized; the other block types ggml
knows are recognised by read() (so a file holding them parses) only where their block size is
certain here; everything else is an unknown tensor type.

CLI:
  gguf_ref.py info FILE                  metadata (long arrays shown by length) and tensors
  gguf_ref.py dump FILE TENSOR OUT.npy   one tensor dequantized to float32, in HF shape
"""
import struct
import sys

import numpy as np

MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
MAX_DIMS = 4  # ggml's GGML_MAX_DIMS; the spec says "currently at most 4"
MAX_NAME_BYTES = 64  # the spec's limit on a tensor name
INT64_MAX = (1 << 63) - 1

# metadata value types of the specification
UINT8, INT8, UINT16, INT16, UINT32, INT32, FLOAT32, BOOL, STRING, ARRAY, UINT64, INT64, FLOAT64 = range(13)
VALUE_TYPE_NAMES = ["UINT8", "INT8", "UINT16", "INT16", "UINT32", "INT32", "FLOAT32", "BOOL",
                    "STRING", "ARRAY", "UINT64", "INT64", "FLOAT64"]
# fixed-size value types: struct code and the NumPy dtype used to read arrays of them fast
SCALAR_FORMATS = {
    UINT8: ("<B", "<u1"), INT8: ("<b", "<i1"), UINT16: ("<H", "<u2"), INT16: ("<h", "<i2"),
    UINT32: ("<I", "<u4"), INT32: ("<i", "<i4"), FLOAT32: ("<f", "<f4"), BOOL: ("<B", "<u1"),
    UINT64: ("<Q", "<u8"), INT64: ("<q", "<i8"), FLOAT64: ("<d", "<f8"),
}

# ggml tensor types: id -> (name, elements per block, bytes per block)
F32, F16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1 = 0, 1, 2, 3, 6, 7, 8, 9
Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, Q8_K = 10, 11, 12, 13, 14, 15
I8, I16, I32, I64, F64, BF16 = 24, 25, 26, 27, 28, 30
QK_K = 256
GGML_TYPES = {
    F32: ("F32", 1, 4), F16: ("F16", 1, 2), BF16: ("BF16", 1, 2), F64: ("F64", 1, 8),
    I8: ("I8", 1, 1), I16: ("I16", 1, 2), I32: ("I32", 1, 4), I64: ("I64", 1, 8),
    Q4_0: ("Q4_0", 32, 2 + 16), Q4_1: ("Q4_1", 32, 2 + 2 + 16),
    Q5_0: ("Q5_0", 32, 2 + 4 + 16), Q5_1: ("Q5_1", 32, 2 + 2 + 4 + 16),
    Q8_0: ("Q8_0", 32, 2 + 32), Q8_1: ("Q8_1", 32, 2 + 2 + 32),
    Q2_K: ("Q2_K", QK_K, QK_K // 16 + QK_K // 4 + 2 + 2),
    Q3_K: ("Q3_K", QK_K, QK_K // 8 + QK_K // 4 + 12 + 2),
    Q4_K: ("Q4_K", QK_K, 2 + 2 + 12 + QK_K // 2),
    Q5_K: ("Q5_K", QK_K, 2 + 2 + 12 + QK_K // 8 + QK_K // 2),
    Q6_K: ("Q6_K", QK_K, QK_K // 2 + QK_K // 4 + QK_K // 16 + 2),
    Q8_K: ("Q8_K", QK_K, 4 + QK_K + QK_K // 16 * 2),
}
TYPE_IDS = {v[0]: k for k, v in GGML_TYPES.items()}
DEQUANTIZABLE = (F32, F16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K, BF16)


def type_name(type_id):
    return GGML_TYPES[type_id][0] if type_id in GGML_TYPES else "type %d" % type_id


class TensorInfo:
    def __init__(self, name, dims, type_id, offset, nbytes, data_offset):
        self.name = name
        self.dims = tuple(dims)  # as GGUF stores them: ne0 (contiguous) first
        self.type = type_id
        self.offset = offset  # relative to the data section, as stored
        self.nbytes = nbytes
        self.data_offset = data_offset  # absolute position in the file

    @property
    def type_name(self):
        return type_name(self.type)

    @property
    def hf_shape(self):
        return tuple(reversed(self.dims))

    @property
    def n_elements(self):
        n = 1
        for d in self.dims:
            n *= d
        return n

    def __repr__(self):
        return "TensorInfo(%r, dims=%r, %s, offset=%d, nbytes=%d)" % (
            self.name, self.dims, self.type_name, self.offset, self.nbytes)


class GGUFFile:
    """What read() returns: the parsed header, metadata and tensor infos, plus the raw bytes."""

    def __init__(self, path, version, metadata, value_types, tensors, alignment, data_start, blob):
        self.path = path
        self.version = version
        self.metadata = metadata  # key -> Python value (arrays are lists, bools are bool)
        self.value_types = value_types  # key -> value type id, or (ARRAY, element type id[, ...])
        self.tensors = tensors  # list in file order
        self.tensor_by_name = {t.name: t for t in tensors}
        self.alignment = alignment
        self.data_start = data_start
        self._blob = blob

    def raw(self, name):
        t = self.tensor_by_name[name]
        return self._blob[t.data_offset:t.data_offset + t.nbytes]

    def tensor(self, name):
        """The tensor dequantized to float32, in HF shape (the GGUF dims reversed)."""
        return dequantize(self.tensor_by_name[name], self.raw(name))


class _Cursor:
    """Reads little-endian fields from the file's bytes, and names what was being read when the
    file ends early, so that a truncated file gives a message that says where."""

    def __init__(self, blob):
        self.blob = blob
        self.pos = 0

    def remaining(self):
        return len(self.blob) - self.pos

    def take(self, n, what):
        if n > self.remaining():
            raise ValueError("truncated file: %s needs %d bytes at offset %d but the file has %d bytes" % (
                what, n, self.pos, len(self.blob)))
        b = self.blob[self.pos:self.pos + n]
        self.pos += n
        return b

    def scalar(self, fmt, what):
        return struct.unpack(fmt, self.take(struct.calcsize(fmt), what))[0]

    def u32(self, what):
        return self.scalar("<I", what)

    def u64(self, what):
        return self.scalar("<Q", what)

    def string(self, what):
        n = self.u64("length of " + what)
        if n > self.remaining():
            raise ValueError("absurd string length %d for %s at offset %d: beyond the %d-byte file" % (
                n, what, self.pos - 8, len(self.blob)))
        b = self.take(n, what)
        try:
            return b.decode("utf-8")
        except UnicodeDecodeError as e:
            raise ValueError("%s is not valid UTF-8: %s" % (what, e)) from None


def _read_value(cur, vtype, what):
    """One metadata value of type vtype; returns (value, type description)."""
    if vtype in SCALAR_FORMATS:
        v = cur.scalar(SCALAR_FORMATS[vtype][0], what)
        if vtype == BOOL:
            if v not in (0, 1):
                raise ValueError("%s: bool value %d is neither 0 nor 1" % (what, v))
            v = bool(v)
        return v, vtype
    if vtype == STRING:
        return cur.string(what), STRING
    if vtype == ARRAY:
        etype = cur.u32("element type of " + what)
        n = cur.u64("length of " + what)
        if etype in SCALAR_FORMATS:
            size = struct.calcsize(SCALAR_FORMATS[etype][0])
        elif etype == STRING:
            size = 8  # at least its length field
        elif etype == ARRAY:
            size = 12  # at least a nested array's type and length
        else:
            raise ValueError("unknown value type %d for the elements of array %s" % (etype, what))
        if n * size > cur.remaining():
            raise ValueError("absurd array length %d for %s: %d elements of at least %d bytes "
                             "do not fit in the %d bytes left in the file" % (n, what, n, size, cur.remaining()))
        if etype in SCALAR_FORMATS:
            arr = np.frombuffer(cur.take(n * size, what), dtype=SCALAR_FORMATS[etype][1])
            if etype == BOOL:
                if np.any(arr > 1):
                    raise ValueError("%s: bool array holds a value that is neither 0 nor 1" % what)
                return [bool(x) for x in arr], (ARRAY, etype)
            return arr.tolist(), (ARRAY, etype)
        items, sub = [], None
        for i in range(n):
            v, sub = _read_value(cur, etype, "%s[%d]" % (what, i))
            items.append(v)
        return items, (ARRAY, etype) if etype == STRING else (ARRAY, etype, sub)
    raise ValueError("unknown value type %d for metadata key %s" % (vtype, what))


def tensor_nbytes(name, dims, type_id):
    """Bytes of a tensor's data; raises ValueError when the type or shape cannot be stored."""
    if type_id not in GGML_TYPES:
        raise ValueError("tensor '%s' has unknown tensor type %d" % (name, type_id))
    tname, block, size = GGML_TYPES[type_id]
    n = 1
    for d in dims:
        n *= d
    if n > INT64_MAX:
        raise ValueError("tensor '%s': element count of dims %s overflows 64 bits" % (name, list(dims)))
    if dims[0] % block:
        raise ValueError("tensor '%s': ne0 = %d is not a whole number of %s blocks of %d" % (
            name, dims[0], tname, block))
    nbytes = n // block * size
    if nbytes > INT64_MAX:
        raise ValueError("tensor '%s': byte size overflows 64 bits" % name)
    return nbytes


def read(path):
    with open(path, "rb") as f:
        blob = f.read()
    return parse(blob, path)


def parse(blob, path="<bytes>"):
    cur = _Cursor(blob)
    magic = cur.take(4, "magic")
    if magic != MAGIC:
        raise ValueError("bad magic %r: not a GGUF file (expected %r)" % (magic, MAGIC))
    version = cur.u32("version")
    if version not in SUPPORTED_VERSIONS:
        raise ValueError("unsupported GGUF version %d (supported: %s)" % (
            version, ", ".join(map(str, SUPPORTED_VERSIONS))))
    n_tensors = cur.u64("tensor count")
    n_kv = cur.u64("metadata count")
    # each metadata pair takes at least 8+4+1 bytes and each tensor info 8+4+4+8
    if n_kv * 13 > cur.remaining() or n_tensors * 24 > cur.remaining():
        raise ValueError("absurd header counts (%d tensors, %d metadata pairs) for a %d-byte file" % (
            n_tensors, n_kv, len(blob)))

    metadata, value_types = {}, {}
    for i in range(n_kv):
        key = cur.string("metadata key #%d" % i)
        vtype = cur.u32("value type of " + key)
        if vtype > FLOAT64:
            raise ValueError("unknown value type %d for metadata key %s" % (vtype, key))
        value, vt = _read_value(cur, vtype, key)
        if key in metadata:
            raise ValueError("duplicate metadata key %s" % key)
        metadata[key] = value
        value_types[key] = vt

    alignment = DEFAULT_ALIGNMENT
    if "general.alignment" in metadata:
        if value_types["general.alignment"] != UINT32:
            raise ValueError("general.alignment must be a UINT32, not %s" % (
                _type_text(value_types["general.alignment"])))
        alignment = metadata["general.alignment"]
        if alignment == 0 or alignment & (alignment - 1):
            raise ValueError("general.alignment %d is not a power of two" % alignment)

    infos = []
    for i in range(n_tensors):
        name = cur.string("tensor name #%d" % i)
        if len(name.encode("utf-8")) > MAX_NAME_BYTES:
            raise ValueError("tensor name '%s...' is longer than %d bytes" % (name[:40], MAX_NAME_BYTES))
        n_dims = cur.u32("dimension count of tensor '%s'" % name)
        if n_dims == 0 or n_dims > MAX_DIMS:
            raise ValueError("tensor '%s' has %d dimensions (1 to %d allowed)" % (name, n_dims, MAX_DIMS))
        dims = [cur.u64("dimension %d of tensor '%s'" % (k, name)) for k in range(n_dims)]
        if any(d == 0 for d in dims):
            raise ValueError("tensor '%s' has a zero dimension in dims %s" % (name, dims))
        if any(d > INT64_MAX for d in dims):
            raise ValueError("tensor '%s': dimension in %s overflows a signed 64-bit count" % (name, dims))
        type_id = cur.u32("type of tensor '%s'" % name)
        offset = cur.u64("offset of tensor '%s'" % name)
        infos.append((name, dims, type_id, offset))

    data_start = _align(cur.pos, alignment)
    if data_start > len(blob) and n_tensors:
        raise ValueError("truncated file: the tensor data section would start at %d, past the end (%d bytes)" % (
            data_start, len(blob)))

    tensors, seen = [], set()
    for name, dims, type_id, offset in infos:
        if name in seen:
            raise ValueError("duplicate tensor name '%s'" % name)
        seen.add(name)
        nbytes = tensor_nbytes(name, dims, type_id)
        if offset % alignment:
            raise ValueError("tensor '%s' offset %d is misaligned: not a multiple of the alignment %d" % (
                name, offset, alignment))
        start = data_start + offset
        if start > len(blob):
            raise ValueError("tensor '%s' offset %d points beyond the end of the file (%d bytes)" % (
                name, offset, len(blob)))
        if start + nbytes > len(blob):
            raise ValueError("truncated file: tensor '%s' data (%d bytes at %d) runs past the end of the file "
                             "(%d bytes)" % (name, nbytes, start, len(blob)))
        tensors.append(TensorInfo(name, dims, type_id, offset, nbytes, start))

    by_start = sorted(tensors, key=lambda t: t.data_offset)
    for a, b in zip(by_start, by_start[1:]):
        if a.data_offset + a.nbytes > b.data_offset:
            raise ValueError("tensor '%s' data overlaps tensor '%s'" % (a.name, b.name))
    return GGUFFile(path, version, metadata, value_types, tensors, alignment, data_start, blob)


def _align(pos, alignment):
    return pos + (alignment - pos % alignment) % alignment


def _type_text(vt):
    if isinstance(vt, tuple):
        return "ARRAY of " + _type_text(vt[2] if len(vt) > 2 else vt[1])
    return VALUE_TYPE_NAMES[vt] if 0 <= vt < len(VALUE_TYPE_NAMES) else str(vt)


# ---------------------------------------------------------------------------------------------
# model-level checks: things a GGUF file can hold that a qwen3 loader must still refuse

def qwen3_expected_shapes(md, n_vocab):
    """GGUF dims (ne0 first) of every tensor a qwen3 file holds, from its metadata."""
    a = "qwen3."
    n_embd = md[a + "embedding_length"]
    n_head = md[a + "attention.head_count"]
    n_kv = md.get(a + "attention.head_count_kv", n_head)
    head_dim = md.get(a + "attention.key_length", n_embd // n_head)
    v_dim = md.get(a + "attention.value_length", head_dim)
    n_ff = md[a + "feed_forward_length"]  # llama.cpp's spelling, not the spec's feedforward_length
    shapes = {"token_embd.weight": (n_embd, n_vocab), "output_norm.weight": (n_embd,)}
    for i in range(md[a + "block_count"]):
        p = "blk.%d." % i
        shapes.update({
            p + "attn_norm.weight": (n_embd,), p + "ffn_norm.weight": (n_embd,),
            p + "attn_q.weight": (n_embd, n_head * head_dim), p + "attn_k.weight": (n_embd, n_kv * head_dim),
            p + "attn_v.weight": (n_embd, n_kv * v_dim), p + "attn_output.weight": (n_head * v_dim, n_embd),
            p + "attn_q_norm.weight": (head_dim,), p + "attn_k_norm.weight": (head_dim,),
            p + "ffn_gate.weight": (n_embd, n_ff), p + "ffn_up.weight": (n_embd, n_ff),
            p + "ffn_down.weight": (n_ff, n_embd),
        })
    return shapes


# The architectures rlx runs (core/src/model/arch/), by GGUF name.
RLX_GGUF_ARCHS = {"qwen3": "qwen3", "qwen3moe": "qwen3_moe", "qwen2": "qwen2", "llama": "llama"}


def check_model(g):
    """Raise ValueError when a parsed file is not a loadable qwen3 model (missing architecture or
    hyperparameters, missing or extra tensors, shapes that disagree with the metadata)."""
    md = g.metadata
    arch = md.get("general.architecture")
    if arch is None:
        raise ValueError("general.architecture is missing")
    if arch not in RLX_GGUF_ARCHS:
        raise ValueError("general.architecture is '%s', not one rlx runs (%s)" % (
            arch, ", ".join("%s as GGUF %s" % (name, gguf) for gguf, name in RLX_GGUF_ARCHS.items())))
    if arch != "qwen3":
        raise ValueError("general.architecture is '%s', only 'qwen3' is checked here" % arch)
    for k in ("block_count", "embedding_length", "feed_forward_length", "attention.head_count"):
        if "qwen3." + k not in md:
            raise ValueError("qwen3.%s is missing" % k)
    tokens = md.get("tokenizer.ggml.tokens")
    if tokens is None:
        raise ValueError("tokenizer.ggml.tokens is missing")
    shapes = qwen3_expected_shapes(md, len(tokens))
    for name, want in shapes.items():
        t = g.tensor_by_name.get(name)
        if t is None:
            raise ValueError("tensor '%s' is missing" % name)
        if t.dims != tuple(want):
            raise ValueError("tensor '%s' has shape %s (GGUF dims) but the metadata implies %s" % (
                name, list(t.dims), list(want)))
    # RoPE as llama.cpp describes it: over the first rope.dimension_count values of each head (the
    # whole head, or an even part of it: llama.cpp's n_rot, NeoX pairs within that part), unscaled
    # or with Llama 3.1's divisors (rope_freqs.weight: head_dim / 2 positive F32 values); other
    # scalings (yarn, linear) change the rotation and are not something this check knows
    head_dim = md.get("qwen3.attention.key_length", md["qwen3.embedding_length"] // md["qwen3.attention.head_count"])
    rope_dims = md.get("qwen3.rope.dimension_count", head_dim)
    if rope_dims > head_dim or rope_dims % 2:
        raise ValueError("qwen3.rope.dimension_count is %d, not head_dim %d or an even part of it" % (
            rope_dims, head_dim))
    scaling = md.get("qwen3.rope.scaling.type", "none")
    if scaling != "none":
        raise ValueError("qwen3.rope.scaling.type is '%s': only unscaled RoPE or rope_freqs is known" % scaling)
    freqs = g.tensor_by_name.get("rope_freqs.weight")
    if freqs is not None:
        if freqs.dims != (head_dim // 2,) or freqs.type != F32:
            raise ValueError("rope_freqs.weight has dims %s, type %s: head_dim / 2 = %d F32 values expected" % (
                list(freqs.dims), type_name(freqs.type), head_dim // 2))
        values = np.frombuffer(g.raw(freqs.name), dtype="<f4")
        if not (values > 0).all():
            raise ValueError("rope_freqs.weight holds a value that is not positive")
    extra = [t.name for t in g.tensors
             if t.name not in shapes and t.name not in ("output.weight", "rope_freqs.weight")]
    if extra:
        raise ValueError("unexpected tensor '%s' for qwen3" % extra[0])


# ---------------------------------------------------------------------------------------------
# dequantization: each function takes the raw bytes of n elements and returns float32[n]

def _f16(b):
    """Little-endian half floats in a uint8 array (last axis 2 bytes) -> float32 (exact)."""
    return np.ascontiguousarray(b).view("<f2").astype(np.float32)[..., 0]


def _blocks(raw, block_bytes):
    a = np.frombuffer(raw, dtype=np.uint8)
    if a.size % block_bytes:
        raise ValueError("data of %d bytes is not a whole number of %d-byte blocks" % (a.size, block_bytes))
    return a.reshape(-1, block_bytes)


def _split_nibbles(qs):
    """Low and high nibbles of packed 4-bit quants. ggml puts element j in the low nibble of byte j
    and element j + half in the high nibble (not neighbouring elements in one byte)."""
    return qs & 0x0F, qs >> 4


def _k4_scales(s):
    """The 6-bit scales and mins of the 8 sub-blocks of a Q4_K/Q5_K block (ggml's
    get_scale_min_k4): sub-blocks 0-3 use the low 6 bits of bytes 0-3 (scale) and 4-7 (min);
    sub-blocks 4-7 take their low 4 bits from bytes 8-11 (scale low nibble, min high nibble)
    and their top 2 bits from the spare top bits of bytes 0-3 (scale) and 4-7 (min)."""
    s = s.astype(np.uint8)
    sc = np.empty(s.shape[:-1] + (8,), dtype=np.uint8)
    mn = np.empty_like(sc)
    sc[..., :4] = s[..., 0:4] & 63
    mn[..., :4] = s[..., 4:8] & 63
    sc[..., 4:] = (s[..., 8:12] & 0x0F) | ((s[..., 0:4] >> 6) << 4)
    mn[..., 4:] = (s[..., 8:12] >> 4) | ((s[..., 4:8] >> 6) << 4)
    return sc, mn


def _q4_0(raw):
    b = _blocks(raw, 18)
    d = _f16(b[:, 0:2])[:, None]
    lo, hi = _split_nibbles(b[:, 2:18])
    q = np.concatenate([lo, hi], axis=1).astype(np.int32) - 8
    return (q.astype(np.float32) * d).ravel()


def _q4_1(raw):
    b = _blocks(raw, 20)
    d = _f16(b[:, 0:2])[:, None]
    m = _f16(b[:, 2:4])[:, None]
    lo, hi = _split_nibbles(b[:, 4:20])
    q = np.concatenate([lo, hi], axis=1).astype(np.float32)
    return (q * d + m).ravel()


def _q5_high_bits(qh_bytes):
    """The 32 fifth bits of a Q5_0/Q5_1 block: bit j of the little-endian u32 belongs to element j."""
    qh = np.ascontiguousarray(qh_bytes).view("<u4")  # (nb, 1)
    return ((qh >> np.arange(32, dtype=np.uint32)) & 1).astype(np.uint8)


def _q5_0(raw):
    b = _blocks(raw, 22)
    d = _f16(b[:, 0:2])[:, None]
    h = _q5_high_bits(b[:, 2:6])
    lo, hi = _split_nibbles(b[:, 6:22])
    q = (np.concatenate([lo, hi], axis=1) | (h << 4)).astype(np.int32) - 16
    return (q.astype(np.float32) * d).ravel()


def _q5_1(raw):
    b = _blocks(raw, 24)
    d = _f16(b[:, 0:2])[:, None]
    m = _f16(b[:, 2:4])[:, None]
    h = _q5_high_bits(b[:, 4:8])
    lo, hi = _split_nibbles(b[:, 8:24])
    q = (np.concatenate([lo, hi], axis=1) | (h << 4)).astype(np.float32)
    return (q * d + m).ravel()


def _q8_0(raw):
    b = _blocks(raw, 34)
    d = _f16(b[:, 0:2])[:, None]
    q = b[:, 2:34].view(np.int8).astype(np.float32)
    return (q * d).ravel()


def _k_quant_codes_4bit(qs):
    """Q4_K/Q5_K low 4 bits as (nb, 8 sub-blocks, 32): each 32-byte group holds two sub-blocks,
    the first in the low nibbles and the second in the high nibbles."""
    lo, hi = _split_nibbles(qs.reshape(-1, 4, 32))
    return np.stack([lo, hi], axis=2).reshape(-1, 8, 32)


def _k_steps(b):
    """Sub-block steps d1 = d*sc and mins m1 = dmin*m (float32, as ggml computes them) of
    Q4_K/Q5_K blocks, which both start with f16 d, f16 dmin and the 12 packed scale bytes."""
    d = _f16(b[:, 0:2])[:, None]
    dmin = _f16(b[:, 2:4])[:, None]
    sc, mn = _k4_scales(b[:, 4:16])
    return d * sc.astype(np.float32), dmin * mn.astype(np.float32)


def _q4_k_grid(raw):
    b = _blocks(raw, 144)
    d1, m1 = _k_steps(b)
    return d1, m1, _k_quant_codes_4bit(b[:, 16:144])


def _q5_k_grid(raw):
    b = _blocks(raw, 176)
    d1, m1 = _k_steps(b)
    qh = b[:, 16:48]  # bit s of qh[l] is the fifth bit of element l of sub-block s
    h = (qh[:, None, :] >> np.arange(8, dtype=np.uint8)[None, :, None]) & 1
    return d1, m1, _k_quant_codes_4bit(b[:, 48:176]) + (h << 4)


def _k_values(d1, m1, q):
    """ggml's d1*q - m1 for each element of each sub-block, rounded after each operation."""
    return (d1[:, :, None] * q.astype(np.float32) - m1[:, :, None]).ravel()


def _q4_k(raw):
    return _k_values(*_q4_k_grid(raw))


def _q5_k(raw):
    return _k_values(*_q5_k_grid(raw))


def _q6_k_grid(raw):
    """Per 16-element sub-block step d*sc (float32) and the signed codes q - 32."""
    b = _blocks(raw, 210)
    ql = b[:, 0:128].reshape(-1, 2, 64)
    qh = b[:, 128:192].reshape(-1, 2, 32)
    sc = b[:, 192:208].view(np.int8).astype(np.float32)
    d = _f16(b[:, 208:210])[:, None]
    lo, hi = _split_nibbles(ql)
    # each 128-element half: elements 0-31 from low nibbles of ql[0:32] and qh bits 0-1,
    # 32-63 low nibbles of ql[32:64] and bits 2-3, 64-95 high nibbles of ql[0:32] and bits 4-5,
    # 96-127 high nibbles of ql[32:64] and bits 6-7
    q = np.stack([lo[..., :32] | ((qh & 3) << 4), lo[..., 32:] | (((qh >> 2) & 3) << 4),
                  hi[..., :32] | (((qh >> 4) & 3) << 4), hi[..., 32:] | (((qh >> 6) & 3) << 4)], axis=2)
    q = q.reshape(-1, 16, 16).astype(np.int32) - 32
    return d * sc, q


def _q6_k(raw):
    step, q = _q6_k_grid(raw)
    return (step[:, :, None] * q.astype(np.float32)).ravel()


def _f32(raw):
    return np.frombuffer(raw, dtype="<f4").astype(np.float32)


def _f16_plain(raw):
    return np.frombuffer(raw, dtype="<f2").astype(np.float32)


def _bf16(raw):
    return (np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16).view(np.float32)


DEQUANTIZERS = {F32: _f32, F16: _f16_plain, BF16: _bf16, Q4_0: _q4_0, Q4_1: _q4_1, Q5_0: _q5_0,
                Q5_1: _q5_1, Q8_0: _q8_0, Q4_K: _q4_k, Q5_K: _q5_k, Q6_K: _q6_k}


def dequantize(info, raw_bytes):
    """float32 array of HF shape (reversed GGUF dims) from a tensor's raw bytes."""
    fn = DEQUANTIZERS.get(info.type)
    if fn is None:
        raise ValueError("tensor '%s': cannot dequantize %s" % (info.name, info.type_name))
    if len(raw_bytes) != info.nbytes:
        raise ValueError("tensor '%s': %d data bytes, expected %d" % (info.name, len(raw_bytes), info.nbytes))
    y = fn(bytes(raw_bytes) if not isinstance(raw_bytes, (bytes, bytearray)) else raw_bytes)
    return y.reshape(info.hf_shape)


def quant_grid(type_id, raw):
    """For each element: the grid the quantizer could choose from, as float32 arrays
    (step, offset, qlo, qhi): representable values are step*k + offset for integer k in
    [qlo, qhi]. Used by tests to bound quantization error from a block's own scales."""
    if type_id in (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0):
        size = GGML_TYPES[type_id][2]
        b = _blocks(raw, size)
        d = np.repeat(_f16(b[:, 0:2]), 32)
        has_min = type_id in (Q4_1, Q5_1)
        off = np.repeat(_f16(b[:, 2:4]), 32) if has_min else np.zeros_like(d)
        lo, hi = {Q4_0: (-8, 7), Q4_1: (0, 15), Q5_0: (-16, 15), Q5_1: (0, 31), Q8_0: (-128, 127)}[type_id]
        return d, off, lo, hi
    if type_id in (Q4_K, Q5_K):
        d1, m1, _ = (_q4_k_grid if type_id == Q4_K else _q5_k_grid)(raw)
        return np.repeat(d1.ravel(), 32), -np.repeat(m1.ravel(), 32), 0, 15 if type_id == Q4_K else 31
    if type_id == Q6_K:
        step, _ = _q6_k_grid(raw)
        s = np.repeat(step.ravel(), 16)
        return s, np.zeros_like(s), -32, 31
    raise ValueError("no quantization grid for %s" % type_name(type_id))


# ---------------------------------------------------------------------------------------------
# quantizers for crafting files: ggml's simple reference quantizers (quantize_row_q4_0_ref ...
# quantize_row_q8_0_ref), float32 step by step so that the bytes match llama.cpp's (the test
# checks this on the Q4_0 and Q8_0 tensors llama-quantize wrote). The K types' quantizers search
# for scales and are not reproduced.

def _round_half_away(v):
    """C's roundf on float32 values, exactly (floor(|v| + 0.5) can round wrongly in float32)."""
    a = np.abs(v.astype(np.float64))
    r = np.floor(a)
    r += (a - r) >= 0.5
    return np.copysign(r, v)


def _pack_nibbles(codes):
    """(nb, 32) codes 0..15 -> (nb, 16) bytes: element j low nibble, element j+16 high nibble."""
    return (codes[:, :16] | (codes[:, 16:] << 4)).astype(np.uint8)


def _pack_q5_high(codes):
    bits = ((codes >> 4) & 1).astype(np.uint64) << np.arange(32, dtype=np.uint64)
    return bits.sum(axis=1).astype("<u4").view(np.uint8).reshape(-1, 4)


def _half_bytes(v):
    return v.astype(np.float16).view(np.uint8).reshape(-1, 2)


def _signed_absmax(x):
    """Per row the value of largest magnitude, the first one on ties (ggml compares amax < |v|)."""
    return x[np.arange(x.shape[0]), np.argmax(np.abs(x), axis=1)]


def quantize(type_id, x):
    """Raw bytes of float32 values x (length a multiple of the block size) in a ggml type."""
    x = np.ascontiguousarray(x, dtype=np.float32).ravel()
    f = np.float32
    if type_id == F32:
        return x.astype("<f4").tobytes()
    if type_id == F16:
        return x.astype("<f2").tobytes()
    if type_id == BF16:
        u = x.view(np.uint32).astype(np.uint64)
        u = (u + 0x7FFF + ((u >> 16) & 1)) >> 16  # round to nearest even (NaNs are not handled)
        return u.astype("<u2").tobytes()
    xb = x.reshape(-1, 32)
    with np.errstate(divide="ignore"):
        if type_id == Q8_0:
            d = np.abs(xb).max(axis=1) / f(127)
            inv = np.where(d != 0, f(1) / d, f(0)).astype(np.float32)
            q = _round_half_away(xb * inv[:, None]).astype(np.int8)
            return np.concatenate([_half_bytes(d), q.view(np.uint8)], axis=1).tobytes()
        if type_id in (Q4_0, Q5_0):
            nmax = 8 if type_id == Q4_0 else 16
            d = _signed_absmax(xb) / f(-nmax)
            inv = np.where(d != 0, f(1) / d, f(0)).astype(np.float32)
            v = xb * inv[:, None] + f(nmax + 0.5)
            q = np.minimum(2 * nmax - 1, np.trunc(v).astype(np.int32)).astype(np.uint32)
            parts = [_half_bytes(d)] + ([_pack_q5_high(q)] if type_id == Q5_0 else []) + [_pack_nibbles(q & 15)]
            return np.concatenate(parts, axis=1).tobytes()
        if type_id in (Q4_1, Q5_1):
            nmax = 15 if type_id == Q4_1 else 31
            lo, hi = xb.min(axis=1), xb.max(axis=1)
            d = (hi - lo) / f(nmax)
            inv = np.where(d != 0, f(1) / d, f(0)).astype(np.float32)
            v = (xb - lo[:, None]) * inv[:, None] + f(0.5)
            q = np.trunc(v).astype(np.int32)
            if type_id == Q4_1:
                q = np.minimum(15, q)  # ggml's Q5_1 quantizer has no such clamp
            q = q.astype(np.uint32)
            high = [_pack_q5_high(q)] if type_id == Q5_1 else []
            parts = [_half_bytes(d), _half_bytes(lo)] + high + [_pack_nibbles(q & 15)]
            return np.concatenate(parts, axis=1).tobytes()
    raise ValueError("no quantizer for %s" % type_name(type_id))


# ---------------------------------------------------------------------------------------------
# writer

class Raw:
    """A metadata value written as given: a value type id (valid or not) followed by bytes. For
    crafting broken files (unknown types, absurd lengths)."""

    def __init__(self, type_id, payload):
        self.type_id = type_id
        self.payload = payload


def _pack_string(s):
    b = s.encode("utf-8") if isinstance(s, str) else s
    return struct.pack("<Q", len(b)) + b


def _pack_value(vtype, value):
    if vtype in SCALAR_FORMATS:
        return struct.pack(SCALAR_FORMATS[vtype][0], int(value) if vtype == BOOL else value)
    if vtype == STRING:
        return _pack_string(value)
    if vtype == ARRAY:
        etype, items = value
        if etype in SCALAR_FORMATS:
            body = np.asarray(items, dtype=SCALAR_FORMATS[etype][1]).tobytes()
        else:
            body = b"".join(_pack_value(etype, x) for x in items)
        return struct.pack("<IQ", etype, len(items)) + body
    raise ValueError("cannot write value type %r" % vtype)


def write(path, metadata, tensors, version=3, alignment=32, magic=MAGIC, offsets=None, truncate=None):
    """Write a GGUF file.

    metadata: dict or list of (key, (type_id, value)); an ARRAY value is (element_type, list);
      a value may be a Raw to write arbitrary bytes after the key. general.alignment is added
      (UINT32) when alignment != 32 and the caller did not give it.
    tensors: list of (name, gguf_dims, ggml_type, raw_bytes); data is laid out in order, each
      start padded to the alignment.
    offsets: optional {name: offset} stored instead of the computed one (the data stays where
      it was laid out); truncate: cut the file to this many bytes. Both exist to make broken files.
    Returns the bytes written."""
    items = list(metadata.items()) if isinstance(metadata, dict) else list(metadata)
    if alignment != DEFAULT_ALIGNMENT and not any(k == "general.alignment" for k, _ in items):
        items.append(("general.alignment", (UINT32, alignment)))
    out = bytearray(magic)
    out += struct.pack("<IQQ", version, len(tensors), len(items))
    for key, val in items:
        out += _pack_string(key)
        if isinstance(val, Raw):
            out += struct.pack("<I", val.type_id) + val.payload
        else:
            vtype, v = val
            out += struct.pack("<I", vtype) + _pack_value(vtype, v)
    layout, pos = [], 0
    for name, dims, ttype, data in tensors:
        pos = _align(pos, alignment)
        layout.append(pos)
        pos += len(data)
    offsets = offsets or {}
    for (name, dims, ttype, data), off in zip(tensors, layout):
        out += _pack_string(name)
        out += struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims)
        out += struct.pack("<IQ", ttype, offsets.get(name, off))
    out += b"\0" * (_align(len(out), alignment) - len(out))
    base = len(out)
    for (name, dims, ttype, data), off in zip(tensors, layout):
        out += b"\0" * (base + off - len(out))
        out += data
    if truncate is not None:
        out = out[:truncate]
    with open(path, "wb") as f:
        f.write(out)
    return bytes(out)


# ---------------------------------------------------------------------------------------------
# CLI

def _show_value(v, limit=16, max_chars=120):
    if isinstance(v, list) and len(v) > limit:
        return "[%d items]" % len(v)
    if isinstance(v, str) and len(v) > max_chars:
        return "<string of %d characters>" % len(v)
    return repr(v)


def _main(argv):
    if len(argv) >= 2 and argv[0] == "info":
        g = read(argv[1])
        print("GGUF version %d, alignment %d, data at %d, %d metadata pairs, %d tensors" % (
            g.version, g.alignment, g.data_start, len(g.metadata), len(g.tensors)))
        for k, v in g.metadata.items():
            print("  %-45s %-10s %s" % (k, _type_text(g.value_types[k]), _show_value(v)))
        for t in g.tensors:
            print("  %-32s %-5s dims %-16s offset %d" % (t.name, t.type_name, list(t.dims), t.offset))
        return 0
    if len(argv) == 4 and argv[0] == "dump":
        g = read(argv[1])
        if argv[2] not in g.tensor_by_name:
            print("no tensor %s in %s" % (argv[2], argv[1]), file=sys.stderr)
            return 1
        np.save(argv[3], g.tensor(argv[2]))
        return 0
    print(__doc__.split("CLI:")[1], file=sys.stderr)
    return 2


if __name__ == "__main__":
    try:
        sys.exit(_main(sys.argv[1:]))
    except ValueError as e:
        print("error: %s" % e, file=sys.stderr)
        sys.exit(1)
