"""The engine's KV caches and their row/slot layout operations.

:class:`RaggedCache` of :class:`GrowingLayer` layers holds a batch's keys and values (b, heads, slots, d); a 0/1
slot mask beside it marks the slots that hold tokens. The functions here re-lay those slots (compaction, joins,
departures), one gather or copy per layer. The cache subclasses transformers' ``DynamicLayer``: it relies on
``Cache(layer_class_to_replicate=...)``, on layers exposing ``keys``/``values`` (b, heads, S, d) and
``is_initialized``, and on ``crop`` taking a negative count, as in transformers 5.23 and 5.24.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache
from transformers.cache_utils import Cache, DynamicLayer

from .._compat import ragged_layout


class GrowingLayer(DynamicLayer):
    """A :class:`~transformers.DynamicLayer` whose keys and values live in buffers with spare room along the
    sequence: ``update`` writes the new tokens in place and ``crop`` only shortens the valid length.

    transformers' DynamicLayer concatenates at every update, a copy of the layer's whole cache per forward:
    without it a SmolLM2 decode step of 16 rows over 400 cached tokens ran 1.21x and one of 32 rows 1.31x faster
    on a 2-core CPU (``docs/research-log.md``). Here a buffer is copied only when it runs out of room, and
    then grows by a quarter (at least ``spare`` slots). ``keys`` and ``values`` read as views of the valid
    length (so code written against DynamicLayer works unchanged); assigning a tensor to them makes it the
    new buffer (no spare room until the next growth).
    """

    spare = 64

    def __init__(self, **kwargs):
        self._keys = self._values = None
        self._lengths = [0, 0]  # valid slots of the keys' and the values' buffer (assigned one after the other)
        super().__init__(**kwargs)

    @property
    def keys(self) -> torch.Tensor | None:
        return None if self._keys is None else self._keys[:, :, : self._lengths[0]]

    @keys.setter
    def keys(self, tensor: torch.Tensor | None) -> None:
        self._keys = tensor
        self._lengths[0] = _seq_length(tensor)

    @property
    def values(self) -> torch.Tensor | None:
        return None if self._values is None else self._values[:, :, : self._lengths[1]]

    @values.setter
    def values(self, tensor: torch.Tensor | None) -> None:
        self._values = tensor
        self._lengths[1] = _seq_length(tensor)

    def assign(self, name: str, buffer: torch.Tensor, length: int) -> None:
        """Make ``buffer`` (b, heads, capacity, d) the ``"keys"`` or ``"values"`` buffer, its first ``length`` slots
        valid (the rest is spare room)."""
        which = ("keys", "values").index(name)
        setattr(self, f"_{name}", buffer)
        self._lengths[which] = length

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.dtype, self.device = key_states.dtype, key_states.device
        self.keys = self.values = None
        self.is_initialized = True

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        start = self._lengths[0]
        end = start + key_states.shape[-2]
        if self._keys is None or end > min(self._keys.shape[-2], self._values.shape[-2]):
            capacity = end + max(self.spare, end // 4)
            self._keys, self._values = (
                self._grown(self.keys, key_states, capacity),
                self._grown(self.values, value_states, capacity),
            )
        self._keys[:, :, start:end] = key_states
        self._values[:, :, start:end] = value_states
        self._lengths = [end, end]
        return self.keys, self.values

    @staticmethod
    def _grown(old: torch.Tensor | None, new: torch.Tensor, capacity: int) -> torch.Tensor:
        b, h, _, d = new.shape
        buffer = new.new_empty((b, h, capacity, d))
        if old is not None and old.shape[-2]:
            buffer[:, :, : old.shape[-2]] = old
        return buffer

    def crop(self, tokens_to_remove: int) -> None:
        if tokens_to_remove > 0:
            raise ValueError(f"crop({tokens_to_remove}): pass a negative number of tokens to remove.")
        if self.is_initialized:
            self._lengths = [max(0, n + tokens_to_remove) for n in self._lengths]


def _seq_length(tensor: torch.Tensor | None) -> int:
    return tensor.shape[-2] if tensor is not None and tensor.dim() == 4 else 0


class RaggedCache(DynamicCache):
    """The engine's cache (the target's and the drafter's): :class:`GrowingLayer` layers (in-place updates),
    and, inside :func:`ragged_forward`, a ragged forward's packed keys and values stored in the padded
    (b, heads, W, d) layout."""

    def __init__(self):
        Cache.__init__(self, layer_class_to_replicate=GrowingLayer)

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        layout = ragged_layout()
        if layout is not None:
            key_states, value_states = layout.unpack_heads(key_states), layout.unpack_heads(value_states)
        return super().update(key_states, value_states, layer_idx, *args, **kwargs)


def relayout_cache(cache: DynamicCache, index: torch.Tensor) -> None:
    """Rebuild every layer as ``new[i, :, j] = old[i, :, index[i, j]]``; index -1 makes a zero (masked) slot.

    One ``index_select`` of (head, slot) rows per layer tensor, straight out of its buffer: a gather with an index
    expanded over heads and head dimensions, then a masked fill, took 12 times longer (a 32-row SmolLM2 cache of
    403 slots: 232 ms against 20 ms on a 2-core CPU, two rounds' worth). A :class:`GrowingLayer` gets its new
    buffer with spare room, so its next update does not copy the cache again.
    """
    holes = (index < 0).nonzero(as_tuple=True)  # (rows, slots) to zero
    source = index.clamp_min(0)
    width = index.shape[1]
    flat: dict[tuple, torch.Tensor] = {}  # the layers' tensors share their layout: one index for all
    for layer in cache.layers:
        growing = isinstance(layer, GrowingLayer)
        capacity = width + max(GrowingLayer.spare, width // 4) if growing else width
        for name in ("keys", "values"):
            old = getattr(layer, name)
            rows, strides = _slot_rows(old)
            key = (strides, old.shape[1], capacity)
            if key not in flat:
                flat[key] = _flat_index(source, old.shape[1], strides, capacity)
            b, h, _, d = old.shape
            new = rows.index_select(0, flat[key]).view(b, h, capacity, d)
            if holes[0].numel():
                new[holes[0], :, holes[1]] = 0
            if growing:
                layer.assign(name, new, width)
            else:
                setattr(layer, name, new)


def _slot_rows(x: torch.Tensor) -> tuple[torch.Tensor, tuple[int, int]]:
    """A (b, h, S, d) tensor as rows of d over its storage, and the row strides of its batch and head dims.

    A view of a :class:`GrowingLayer` buffer (its slot and feature dims dense) is read in place; any other
    layout is copied first."""
    d = x.shape[-1]
    dense = x.stride(-1) == 1 and x.stride(-2) == d and x.stride(0) % d == 0 and x.stride(1) % d == 0
    if not dense:
        x = x.contiguous()
    b, h, slots, _ = x.shape
    count = ((b - 1) * x.stride(0) + (h - 1) * x.stride(1)) // d + slots if x.numel() else 0
    return x.as_strided((count, d), (d, 1)), (x.stride(0) // d, x.stride(1) // d)


def _flat_index(source: torch.Tensor, heads: int, strides: tuple[int, int], capacity: int) -> torch.Tensor:
    """Row numbers of ``new[i, head, j] = old[i, head, source[i, j]]`` over (b, heads, capacity); the spare slots
    past the index read slot 0 (never valid: the layer's length ends before them)."""
    b, width = source.shape
    base = (
        torch.arange(b, device=source.device)[:, None] * strides[0]
        + torch.arange(heads, device=source.device) * strides[1]
    )
    out = base[:, :, None].expand(b, heads, capacity).clone()
    out[:, :, :width] += source[:, None, :]
    return out.view(-1)


def packed_index(mask: torch.Tensor) -> torch.Tensor:
    """(b, S) 0/1 mask -> (b, S') indices of each row's valid slots, right-aligned, -1 padding on the left."""
    counts = mask.sum(-1)
    width = int(counts.max()) if mask.numel() else 0
    index = torch.full((mask.shape[0], width), -1, dtype=torch.long, device=mask.device)
    for i in range(mask.shape[0]):
        valid = mask[i].nonzero().flatten()
        if len(valid):
            index[i, width - len(valid) :] = valid
    return index


def shifted_index(batch: int, length: int, offset: int, device) -> torch.Tensor:
    """(batch, offset + length) indices: ``offset`` holes, then slots 0..length-1."""
    index = torch.arange(-offset, length, device=device).expand(batch, -1).clone()
    index[:, :offset] = -1
    return index


def take_slots(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """Re-lay a (b, S, ...) mask or feature tensor like :func:`relayout_cache`: ``new[i, j] = x[i, index[i, j]]``,
    index -1 gives zeros."""
    gathered = x[torch.arange(x.shape[0], device=x.device)[:, None], index.clamp_min(0)]
    return gathered.masked_fill((index < 0).view(*index.shape, *([1] * (x.dim() - 2))), 0)


# Pack once an eighth of the slots can go: at 32 rows on a 2-core EPYC, 1/8 against 1/4 raised the adaptive
# engine's throughput from 0.93x to 1.03x plain at 16 rows and from 0.98x to 1.02x at 32 (3 interleaved
# passes each, held-out tuning prompts); a relayout costs about a third of a held round.
COMPACT_FRACTION = 0.125


def pack_cache(
    cache: DynamicCache, mask: torch.Tensor, force: bool, min_slots: int, min_fraction: float = COMPACT_FRACTION
) -> torch.Tensor:
    """Right-align every row's valid slots of ``cache``; returns the new (b, S') mask.

    Rows keep different numbers of tokens, so packing can only free the columns that every row has a hole
    in after right-alignment; without ``force`` a cache is packed once it has at least ``min_slots`` slots
    and those columns are ``min_fraction`` of them.
    """
    slots = mask.shape[1]
    removable = slots - int(mask.sum(-1).max()) if slots else 0  # slot columns that packing would free
    if removable == 0 or (not force and (slots < min_slots or removable < min_fraction * slots)):
        return mask
    index = packed_index(mask)
    relayout_cache(cache, index)
    return take_slots(mask, index)


def is_initialized(cache: DynamicCache) -> bool:
    """Whether the cache holds per-row tensors (possibly of length 0 after compaction)."""
    return bool(cache.layers) and all(layer.is_initialized for layer in cache.layers)


def move_rows(cache: DynamicCache, holes: list[int], movers: list[int], size: int) -> None:
    """Copy rows ``movers`` of every initialised layer into rows ``holes`` (in place), then keep the first ``size``."""
    for layer in cache.layers:
        if layer.is_initialized:
            for name in ("keys", "values"):
                tensor = getattr(layer, name)
                for hole, mover in zip(holes, movers):
                    tensor[hole].copy_(tensor[mover])
                setattr(layer, name, tensor[:size])


def append_rows(cache: DynamicCache, count: int) -> None:
    """Add ``count`` all-hole rows (zeros) to every layer of ``cache``."""
    for layer in cache.layers:
        for name in ("keys", "values"):
            old = getattr(layer, name)
            setattr(layer, name, torch.cat([old, old.new_zeros((count, *old.shape[1:]))], dim=0))
