"""The layout of a GGUF file (llama.cpp's format), read from its header and tensor table alone.

A GGUF file is a header (magic, version, tensor and key counts), typed key-value metadata, a table of
tensors (name, shape, type, offset) and then the tensors' data, each at an aligned offset. Reading the
layout tells what the file holds and where its tensors end, without touching their data, so a file of
any length is checked at once. The `gguf` package's reader would do it too, but it parses every
vocabulary string into an array (seconds for an ordinary model), and only its size table is used here.

The counts a hostile header could inflate are bounded (keys, tensors, dimensions, the strings of its
arrays together), so that reading the layout stays short whatever the file says.
"""

from __future__ import annotations

import math
import mmap
import os
import struct
from dataclasses import dataclass
from pathlib import Path

MAX_KEYS = 1 << 16
MAX_TENSORS = 1 << 20
MAX_DIMS = 4  # llama.cpp's GGML_MAX_DIMS
MAX_ARRAY_ITEMS = 1 << 24  # strings and nested arrays of all arrays together (a vocabulary and its merges: ~1M)
DEFAULT_ALIGNMENT = 32
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY = 8, 9


class LayoutError(ValueError):
    """The header or the tensor table cannot be read (cut short, or values no GGUF writer produces)."""


@dataclass(frozen=True)
class Layout:
    strings: dict[str, str]  # the metadata whose values are strings (general.architecture, general.name, ...)
    alignment: int
    tensors: int
    parameters: int  # elements of every tensor
    data_end: int  # where the data of the tensor that ends last ends


class _Cursor:
    """Reads little-endian values from `data` in order, refusing to read past its end."""

    def __init__(self, data) -> None:
        self.data, self.pos, self.items_left = data, 0, MAX_ARRAY_ITEMS

    def skip(self, count: int) -> int:
        start = self.pos
        if count < 0 or start + count > len(self.data):
            raise LayoutError("cut short")
        self.pos += count
        return start

    def take(self, code: str):
        return struct.unpack_from("<" + code, self.data, self.skip(struct.calcsize(code)))[0]

    def string(self) -> str:
        size = self.take("Q")
        start = self.skip(size)
        return bytes(self.data[start : start + size]).decode("utf-8", errors="replace")

    def value(self, kind: int) -> object:
        """A metadata value: a scalar or a string; an array is skipped (None)."""
        if kind in _SCALARS:
            return self.take(_SCALARS[kind])
        if kind == _STRING:
            return self.string()
        if kind != _ARRAY:
            raise LayoutError(f"unknown metadata type {kind}")
        item, count = self.take("I"), self.take("Q")
        if item in _SCALARS:
            self.skip(count * struct.calcsize(_SCALARS[item]))
            return None
        self.items_left -= count
        if self.items_left < 0:
            raise LayoutError(f"more than {MAX_ARRAY_ITEMS:,} strings in its metadata arrays")
        for _ in range(count):
            self.value(item)
        return None


def read_layout(path: Path) -> Layout:
    """The layout of the GGUF file at `path` (its magic and version already checked); LayoutError if its
    header or tensor table cannot be read; ImportError without the `gguf` package (its size table)."""
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    with open(path, "rb") as handle:
        if os.fstat(handle.fileno()).st_size < 24:
            raise LayoutError("cut short")
        with mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as data:
            cursor = _Cursor(data)
            cursor.skip(8)  # magic and version
            tensors, keys = cursor.take("Q"), cursor.take("Q")
            if keys > MAX_KEYS or tensors > MAX_TENSORS:
                raise LayoutError(f"{keys:,} metadata keys and {tensors:,} tensors")
            strings, alignment = {}, DEFAULT_ALIGNMENT
            for _ in range(keys):
                key, value = cursor.string(), cursor.value(cursor.take("I"))
                if isinstance(value, str):
                    strings[key] = value
                elif key == "general.alignment":
                    alignment = value
            if not isinstance(alignment, int) or alignment < 1 or alignment & (alignment - 1):
                raise LayoutError(f"alignment {alignment} is not a power of two")
            spans, parameters = [], 0
            for _ in range(tensors):
                cursor.skip(cursor.take("Q"))  # the tensor's name
                dims = cursor.take("I")
                if dims > MAX_DIMS:
                    raise LayoutError(f"a tensor of {dims} dimensions")
                elements = math.prod(cursor.take("Q") for _ in range(dims))
                kind, offset = cursor.take("I"), cursor.take("Q")
                try:
                    block, block_bytes = GGML_QUANT_SIZES[GGMLQuantizationType(kind)]
                except (ValueError, KeyError):
                    raise LayoutError(f"unknown tensor type {kind}") from None
                if elements % block:
                    raise LayoutError(f"a tensor of {elements:,} elements in blocks of {block}")
                spans.append((offset, elements // block * block_bytes))
                parameters += elements
            start = -(-cursor.pos // alignment) * alignment  # the data begins at the next aligned offset
    end = max((start + offset + size for offset, size in spans), default=start)
    return Layout(strings, alignment, tensors, parameters, end)
