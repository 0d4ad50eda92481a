"""A minimal pure-Python reader of R data: XDR-serialized objects (:func:`read_rds`) and R lazy-load databases
(:func:`read_lazyload_db`, an ``Rdata.rdx`` index with ``Rdata.rdb`` blobs).

It reads the object types found in data packages (vectors, lists, data frames, factors); the janeaustenr
novels of :func:`adaflash_hf.data.corpora.read_austen` arrive this way.
"""

from __future__ import annotations

import bz2
import gzip
import lzma
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# R serialization (XDR, format versions 2 and 3). Codes from R's serialize.c.
_NILVALUE_SXP, _REFSXP, _ALTREP_SXP = 254, 255, 238
_SYMSXP, _LISTSXP, _CHARSXP, _LGLSXP, _INTSXP, _REALSXP, _STRSXP, _VECSXP, _EXPRSXP = 1, 2, 9, 10, 13, 14, 16, 19, 20
_R_NA_INTEGER = -(2**31)
_LATIN1_MASK = 1 << 2


@dataclass(frozen=True)
class _RSymbol:
    name: str


class _XdrReader:
    """Reads R's serialized objects from XDR (big-endian) bytes into Python values."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0
        self.refs: list[Any] = []

    def read_int(self) -> int:
        (value,) = struct.unpack_from(">i", self.data, self.pos)
        self.pos += 4
        return value

    def read_bytes(self, n: int) -> bytes:
        value = self.data[self.pos : self.pos + n]
        self.pos += n
        return value

    def object(self) -> Any:
        flags = self.read_int()
        sxp = flags & 0xFF
        has_attr, has_tag = flags & (1 << 9), flags & (1 << 10)
        if sxp == _NILVALUE_SXP:
            return None
        if sxp == _REFSXP:
            index = (flags >> 8) or self.read_int()
            return self.refs[index - 1]
        if sxp == _SYMSXP:
            symbol = _RSymbol(self.object())
            self.refs.append(symbol)
            return symbol
        if sxp == _CHARSXP:
            n = self.read_int()
            if n == -1:
                return None  # NA_character_
            return self.read_bytes(n).decode("latin-1" if (flags >> 12) & _LATIN1_MASK else "utf-8", errors="replace")
        if sxp == _LISTSXP:  # pairlist: attribute lists and the like, returned as [(tag, value), ...]
            items = []
            while sxp == _LISTSXP:
                if has_attr:
                    self.object()
                tag = self.object() if has_tag else None
                items.append((tag.name if isinstance(tag, _RSymbol) else tag, self.object()))
                flags = self.read_int()
                sxp, has_attr, has_tag = flags & 0xFF, flags & (1 << 9), flags & (1 << 10)
            if sxp != _NILVALUE_SXP:
                raise ValueError(f"Malformed R pairlist (ends with object type {sxp}).")
            return items
        if sxp == _ALTREP_SXP:
            return self._altrep()
        if sxp in (_STRSXP, _VECSXP, _EXPRSXP):
            values: Any = [self.object() for _ in range(self.read_int())]
        elif sxp in (_LGLSXP, _INTSXP):
            n = self.read_int()
            values = [None if v == _R_NA_INTEGER else v for v in struct.unpack_from(f">{n}i", self.data, self.pos)]
            self.pos += 4 * n
        elif sxp == _REALSXP:
            n = self.read_int()
            values = list(struct.unpack_from(f">{n}d", self.data, self.pos))
            self.pos += 8 * n
        else:
            raise ValueError(
                f"Unsupported R object type {sxp} at byte {self.pos}: this reader handles vectors, "
                "lists, data frames and factors only."
            )
        return _apply_attributes(values, dict(self.object()) if has_attr else {})

    def _altrep(self) -> Any:
        info, state, attributes = self.object(), self.object(), self.object()
        kind = info[0][1].name
        if kind in ("compact_intseq", "compact_realseq"):
            n, start, step = state
            values: Any = [start + step * i for i in range(int(n))]
            if kind == "compact_intseq":
                values = [int(v) for v in values]
        elif kind.startswith("wrap_"):
            values = state[0]
        elif kind == "deferred_string":
            values = [None if v is None else str(v) for v in state[0][1]]
        else:
            raise ValueError(f"Unsupported compact R vector {kind!r}.")
        return _apply_attributes(values, dict(attributes) if attributes else {})


def _apply_attributes(values: list[Any], attributes: dict[str, Any]) -> Any:
    """Factors become their level strings; named vectors, lists and data frames become dicts."""
    levels = attributes.get("levels")
    if levels is not None and "factor" in (attributes.get("class") or []):
        values = [None if v is None else levels[v - 1] for v in values]
    names = attributes.get("names")
    if names is not None:
        return dict(zip(names, values, strict=True))
    return values


def read_rds(data: bytes) -> Any:
    """Parse one R serialized object (the content of an ``.rds`` file, compressed or not)."""
    if data[:2] == b"\x1f\x8b":
        data = gzip.decompress(data)
    elif data[:3] == b"BZh":
        data = bz2.decompress(data)
    elif data[:6] == b"\xfd7zXZ\x00":
        data = lzma.decompress(data)
    if data[:2] != b"X\n":
        raise ValueError(
            f"Not an R XDR serialization (starts with {data[:2]!r}); only the default binary "
            "format written by saveRDS()/lazy-load databases is supported."
        )
    reader = _XdrReader(data)
    reader.pos = 2
    version = reader.read_int()
    reader.read_int(), reader.read_int()  # R version that wrote it, minimal R version to read it
    if version == 3:
        reader.read_bytes(reader.read_int())  # native encoding name
    elif version != 2:
        raise ValueError(f"Unsupported R serialization version {version}.")
    return reader.object()


def read_lazyload_db(rdx: Path, rdb: Path) -> dict[str, Any]:
    """All variables of an R lazy-load database (``*.rdx`` index + ``*.rdb`` blobs), by name."""
    index = read_rds(Path(rdx).read_bytes())
    blobs = Path(rdb).read_bytes()
    compression = (index.get("compressed") or [1])[0]
    variables: dict[str, Any] = {}
    for name, (offset, length) in index["variables"].items():
        blob = blobs[offset : offset + length]
        (size,) = struct.unpack(">i", blob[:4])
        if compression in (2, 3):  # a type byte follows the length: Z(lib), 2 (bzip2), X (xz), 0 (none)
            kind, payload = blob[4:5], blob[5:]
            decompress = {b"Z": zlib.decompress, b"2": bz2.decompress, b"X": lzma.decompress, b"0": bytes}[kind]
            raw = decompress(payload)
        else:
            raw = zlib.decompress(blob[4:])
        if len(raw) != size:
            raise ValueError(f"Corrupt lazy-load entry {name!r} in {rdb}: {len(raw)} bytes, expected {size}.")
        variables[name] = read_rds(raw)
    return variables
