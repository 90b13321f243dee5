#!/usr/bin/python3
"""Minimal safetensors reader and writer for the golden tests (no torch, no safetensors package).

File layout: a u64 little-endian header length N, N bytes of JSON header
{name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {str: str}},
then the raw little-endian tensor bytes; data_offsets are relative to the end of the header.
A sharded checkpoint is several such files plus `model.safetensors.index.json`
({"metadata": {"total_size": bytes}, "weight_map": {name: file}}).

Reading maps the files and converts one tensor (or a row range) at a time, so the 1.2 GB
benchmark model never has to be resident. Writing takes one producer per tensor and writes
each header up front from the known shapes, so only one chunk of one tensor is in memory.
"""
import json
import os
from collections.abc import Mapping

import numpy as np

# How each safetensors dtype is stored. BF16 has no NumPy dtype: it is kept as its raw u16 bits.
STORAGE = {"F32": np.dtype("<f4"), "BF16": np.dtype("<u2"), "F16": np.dtype("<f2")}
INDEX_NAME = "model.safetensors.index.json"
SINGLE_NAME = "model.safetensors"


def bf16_bits_to_f32(bits):
    """BF16 is the top half of an IEEE f32, so widening is a shift (exact)."""
    return (np.asarray(bits, dtype=np.uint32) << 16).view(np.float32)


def f32_to_bf16_bits(x):
    """Round f32 to BF16 bits, to nearest with ties to even (what torch's .to(bfloat16) does)."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    u = x.view(np.uint32)
    rounded = ((u + np.uint32(0x7FFF) + ((u >> 16) & np.uint32(1))) >> 16).astype(np.uint16)
    # The rounding add could carry a NaN's payload into the exponent; keep NaNs quiet NaNs instead.
    quiet_nan = ((u >> 16) | np.uint32(0x0040)).astype(np.uint16)
    return np.where(np.isnan(x), quiet_nan, rounded)


def to_f32(stored, dtype):
    """Widen stored values (as read from the file) to float32; exact for all three dtypes."""
    if dtype == "BF16":
        return bf16_bits_to_f32(stored)
    return np.asarray(stored, dtype=np.float32)


def from_f32(x, dtype):
    """Narrow float32 values to the storage representation of `dtype` (round to nearest even)."""
    if dtype == "BF16":
        return f32_to_bf16_bits(x)
    return np.asarray(x, dtype=np.float32).astype(STORAGE[dtype])


def _read_header(path):
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
    return header, 8 + n


class Checkpoint(Mapping):
    """Read-only view of a checkpoint: name -> float32 ndarray, converted on access.

    `path` is a model directory (model.safetensors or a sharded index), a .safetensors file
    or an index .json. Tensors are memory-mapped; `rows` converts only part of a tensor.
    """

    def __init__(self, path):
        if os.path.isdir(path):
            index = os.path.join(path, INDEX_NAME)
            path = index if os.path.exists(index) else os.path.join(path, SINGLE_NAME)
        if path.endswith(".json"):
            with open(path) as f:
                weight_map = json.load(f)["weight_map"]
            folder = os.path.dirname(path)
            files = sorted(set(weight_map.values()))
        else:
            weight_map, folder, files = None, os.path.dirname(path), [os.path.basename(path)]
        self.metadata = {}
        self._entries = {}  # name -> (memmap of the whole file, storage offset, dtype, shape)
        for file in files:
            full = os.path.join(folder, file)
            header, data_start = _read_header(full)
            self.metadata.update(header.pop("__metadata__", {}))
            mm = np.memmap(full, dtype=np.uint8, mode="r")
            for name, info in header.items():
                dtype, shape = info["dtype"], tuple(info["shape"])
                if dtype not in STORAGE:
                    raise ValueError(f"{full}: {name}: unsupported dtype {dtype}")
                begin, end = info["data_offsets"]
                nbytes = int(np.prod(shape, dtype=np.int64)) * STORAGE[dtype].itemsize
                if end - begin != nbytes or data_start + end > mm.size:
                    raise ValueError(f"{full}: {name}: data_offsets {begin},{end} do not fit "
                                     f"shape {list(shape)} {dtype} in a {mm.size}-byte file")
                if weight_map is not None and weight_map.get(name) != file:
                    raise ValueError(f"{full}: {name} is not mapped to this file by the index")
                if name in self._entries:
                    raise ValueError(f"{full}: duplicate tensor {name}")
                self._entries[name] = (mm, data_start + begin, dtype, shape)
        if weight_map is not None and set(weight_map) != set(self._entries):
            missing = sorted(set(weight_map) - set(self._entries))
            raise ValueError(f"{path}: index names tensors missing from the shards: {missing[:5]}")

    def dtype(self, name):
        return self._entries[name][2]

    def shape(self, name):
        return self._entries[name][3]

    def raw(self, name):
        """The stored values without copying (BF16 as u16 bits)."""
        mm, offset, dtype, shape = self._entries[name]
        count = int(np.prod(shape, dtype=np.int64))
        return np.frombuffer(mm, dtype=STORAGE[dtype], count=count, offset=offset).reshape(shape)

    def rows(self, name, index):
        """float32 copy of raw(name)[index]: a gather or a slice along the first axis."""
        return to_f32(self.raw(name)[index], self.dtype(name))

    def __getitem__(self, name):
        return self.rows(name, slice(None))

    def __iter__(self):
        return iter(self._entries)

    def __len__(self):
        return len(self._entries)


def read(path):
    """Eager read: ({name: float32 ndarray}, dtype), where dtype is "F32"/"BF16"/"F16" when all
    tensors share it and "mixed" otherwise."""
    ckpt = Checkpoint(path)
    dtypes = {ckpt.dtype(name) for name in ckpt}
    return {name: ckpt[name] for name in ckpt}, (dtypes.pop() if len(dtypes) == 1 else "mixed")


def _assign_shards(sizes, shards):
    """Split tensors, kept in order, into `shards` contiguous runs of about equal bytes.

    A tensor goes to the shard its byte midpoint falls in, so the split is balanced without
    reordering; every shard must end up non-empty (it can't when one tensor dwarfs the rest).
    """
    total = sum(sizes)
    owner, before = [], 0
    for size in sizes:
        owner.append(min(shards - 1, (2 * before + size) * shards // (2 * total)))
        before += size
    if len(set(owner)) != shards:
        raise ValueError(f"cannot split {len(sizes)} tensors into {shards} non-empty shards")
    return owner


def write(out_dir, specs, dtype, shards=1, metadata=None, single_name=SINGLE_NAME):
    """Write tensors to out_dir as `single_name` (model.safetensors), or as `shards` files plus
    the index.

    specs: list of (name, shape, produce) where produce() yields float32 arrays whose
    concatenated flat values, in C order, are the tensor (one array, or row chunks for big
    tensors). Each producer is called once, in order, while its file is being written.
    Values are rounded to `dtype` ("F32", "BF16", "F16"). Returns the list of files written.
    """
    item = STORAGE[dtype].itemsize
    sizes = [int(np.prod(shape, dtype=np.int64)) * item for _, shape, _ in specs]
    owner = _assign_shards(sizes, shards) if shards > 1 else [0] * len(specs)
    names = ([single_name] if shards == 1 else
             [f"model-{k + 1:05d}-of-{shards:05d}.safetensors" for k in range(shards)])
    os.makedirs(out_dir, exist_ok=True)
    for k, file in enumerate(names):
        members = [i for i in range(len(specs)) if owner[i] == k]
        header, offset = {"__metadata__": {"format": "pt", **(metadata or {})}}, 0
        for i in members:
            name, shape, _ = specs[i]
            header[name] = {"dtype": dtype, "shape": list(shape),
                            "data_offsets": [offset, offset + sizes[i]]}
            offset += sizes[i]
        blob = json.dumps(header, separators=(",", ":")).encode()
        blob += b" " * (-len(blob) % 8)  # pad like the reference library: data starts 8-aligned
        with open(os.path.join(out_dir, file), "wb") as f:
            f.write(len(blob).to_bytes(8, "little"))
            f.write(blob)
            for i in members:
                name, shape, produce = specs[i]
                written = 0
                for chunk in produce():
                    data = from_f32(chunk, dtype).tobytes()
                    f.write(data)
                    written += len(data)
                if written != sizes[i]:
                    raise ValueError(f"{name}: producer gave {written} bytes, shape "
                                     f"{list(shape)} needs {sizes[i]}")
    if shards > 1:
        index = {"metadata": {"total_size": sum(sizes)},
                 "weight_map": {specs[i][0]: names[owner[i]] for i in range(len(specs))}}
        with open(os.path.join(out_dir, INDEX_NAME), "w") as f:
            json.dump(index, f, indent=2)
            f.write("\n")
    return names + ([INDEX_NAME] if shards > 1 else [])
