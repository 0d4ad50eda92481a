"""The one place that knows which transformers version does what (STYLE rule 3).

adaflash-hf supports transformers 5.23 and 5.24. Differences it has to bridge:
- 5.24 renamed the cache keyword of model forwards from ``past_key_values`` to ``cache``;
- ``GenerationMixin._get_candidate_generator`` (private) is the only place where a third-party
  candidate generator can be selected; its name and keyword call site are stable from 4.57 to 5.24.
- SDPA attention repeats a grouped-query model's keys and values for every query head
  (``repeat_kv``: a copy of the whole cache per layer) whenever a forward has more than one query
  token and a mask, unless ``TRANSFORMERS_SDPA_FORCE_GQA=1`` (read at each call, in both versions).
- Ragged verification (:func:`ragged_forward`) runs a batch's new tokens through the model packed
  into one row, so its linear layers see only real tokens. It relies on three things both versions
  do: a 4-D ``attention_mask`` reaches the attention function untouched, ``DynamicCache.update``
  is called with the layer's new keys and values before attention, and attention functions are
  looked up by name in ``ALL_ATTENTION_FUNCTIONS`` at each call (a local override of ``"sdpa"``).
- The engine's cache (:class:`GrowingLayer` in a :class:`RaggedCache`) subclasses ``DynamicLayer``: it relies on
  ``Cache(layer_class_to_replicate=...)``, on layers exposing ``keys``/``values`` (b, heads, S, d) and
  ``is_initialized``, and on ``crop`` taking a negative count, as in both versions.
"""

from __future__ import annotations

import contextvars
import os
import threading
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import transformers
from packaging.version import Version
from transformers import DynamicCache
from transformers.cache_utils import Cache, DynamicLayer

TRANSFORMERS_VERSION = Version(transformers.__version__)
MIN_TRANSFORMERS = Version("5.23.0")

CACHE_KWARG = "cache" if TRANSFORMERS_VERSION >= Version("5.24.0.dev0") else "past_key_values"


def check_transformers_version() -> None:
    if TRANSFORMERS_VERSION < MIN_TRANSFORMERS:
        raise ImportError(
            f"adaflash-hf needs transformers >= {MIN_TRANSFORMERS}, found {TRANSFORMERS_VERSION}. "
            "Upgrade with: pip install -U 'transformers>=5.23,<5.25'."
        )


_FORCE_GQA = "TRANSFORMERS_SDPA_FORCE_GQA"


@contextmanager
def sdpa_gqa(device: torch.device, query_tokens: int):
    """Within the block, CPU SDPA handles grouped-query attention itself instead of copying the cache.

    For verify and prefill forwards (several query tokens per row, a padding mask) this saves a copy
    of the keys and values per layer: 15-18 % of a 16-row verify of SmolLM2-135M on a 2-core CPU, 5 %
    at one row, with bit-identical fp32 logits. A forward of one query token per row is left to
    transformers, which folds the heads instead (forcing GQA there made 16-row steps 1.8x slower).
    Only on CPU: CUDA's fused kernels take no mask with GQA and would fall back to the math kernel.
    A value the user set is left alone.
    """
    if device.type != "cpu" or query_tokens < 2 or _FORCE_GQA in os.environ:
        yield
        return
    os.environ[_FORCE_GQA] = "1"
    try:
        yield
    finally:
        os.environ.pop(_FORCE_GQA, None)


@dataclass
class RaggedLayout:
    """Where each of a verification's T real tokens sits in the padded (b, W) layout, and back.

    ``rows``/``cols`` (T,): the padded slot of each packed token; ``gather`` (b, W): the packed token
    each padded slot copies (a row's padding repeats its last real token, so every padded slot holds
    finite values that the masks and the acceptance never read as real).
    """

    rows: torch.Tensor
    cols: torch.Tensor
    gather: torch.Tensor
    long_rows: torch.Tensor  # (k,) rows with more than one token

    @classmethod
    def from_lengths(cls, lengths: torch.Tensor, width: int) -> RaggedLayout:
        """lengths (b,) real tokens per row (each >= 1), width W >= max(lengths)."""
        device = lengths.device
        b = lengths.shape[0]
        col = torch.arange(width, device=device)[None].expand(b, -1)
        real = col < lengths[:, None]  # (b, W)
        rows, cols = real.nonzero(as_tuple=True)  # row-major: the packed order
        starts = lengths.cumsum(0) - lengths  # (b,) first packed index of each row
        gather = starts[:, None] + torch.minimum(col, lengths[:, None] - 1)  # (b, W)
        return cls(rows, cols, gather, (lengths > 1).nonzero().flatten())

    @property
    def num_tokens(self) -> int:
        return self.rows.shape[0]

    def pack(self, x: torch.Tensor) -> torch.Tensor:
        """(b, W, ...) -> (1, T, ...)"""
        return x[self.rows, self.cols][None]

    def unpack(self, x: torch.Tensor) -> torch.Tensor:
        """(1, T, ...) -> (b, W, ...)"""
        return x[0][self.gather]

    def unpack_heads(self, x: torch.Tensor) -> torch.Tensor:
        """(1, h, T, d) -> (b, h, W, d), for queries, keys and values"""
        return self.unpack(x.transpose(1, 2)).transpose(1, 2)


_RAGGED: contextvars.ContextVar[RaggedLayout | None] = contextvars.ContextVar("adaflash_ragged", default=None)


class GrowingLayer(DynamicLayer):
    """A :class:`~transformers.DynamicLayer` whose keys and values live in buffers with spare room along the
    sequence: ``update`` writes the new tokens in place and ``crop`` only shortens the valid length.

    transformers' DynamicLayer concatenates at every update, a copy of the layer's whole cache per forward:
    without it a SmolLM2 decode step of 16 rows over 400 cached tokens ran 1.21x and one of 32 rows 1.31x faster
    on a 2-core CPU (``results/session15/cache_growth.py``). Here a buffer is copied only when it runs out of room, and
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

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.dtype, self.device = key_states.dtype, key_states.device
        self.keys = self.values = None
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        start = self._lengths[0]
        end = start + key_states.shape[-2]
        if self._keys is None or end > min(self._keys.shape[-2], self._values.shape[-2]):
            capacity = end + max(self.spare, end // 4)
            self._keys, self._values = self._grown(self.keys, key_states, capacity), self._grown(self.values, value_states, capacity)
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
        layout = _RAGGED.get()
        if layout is not None:
            key_states, value_states = layout.unpack_heads(key_states), layout.unpack_heads(value_states)
        return super().update(key_states, value_states, layer_idx, *args, **kwargs)


def _ragged_sdpa(module, query, key, value, attention_mask, *args, **kwargs):
    """SDPA for a packed query (1, H, T, d) over the padded cache; returns (1, T, H, d) like SDPA's (b, q, H, d).

    Where at most half the rows verify more than their anchor, the anchors of all rows attend in one
    one-query pass and only the longer rows' queries in a second (over a copy of those rows' keys and
    values); otherwise all rows attend over the padded (b, W) layout.
    """
    sdpa_attention_forward = _OVERRIDE_USERS[2]  # transformers' SDPA, bound when the override was installed
    layout = _RAGGED.get()
    if layout is None:  # not a ragged forward: whatever "sdpa" was before the override
        return (_OVERRIDE_USERS[1] or sdpa_attention_forward)(module, query, key, value, attention_mask, *args, **kwargs)
    padded = layout.unpack_heads(query)  # (b, H, W, d)
    b, _, width, _ = padded.shape
    long_rows = layout.long_rows
    if 2 * long_rows.numel() > b:
        out, weights = sdpa_attention_forward(module, padded, key, value, attention_mask, *args, **kwargs)  # (b, W, H, d)
        return layout.pack(out), weights
    anchors, weights = sdpa_attention_forward(module, padded[:, :, :1], key, value, attention_mask[:, :, :1], *args, **kwargs)
    out = anchors.expand(-1, width, -1, -1).clone()  # (b, W, H, d)
    if long_rows.numel():
        rest, _ = sdpa_attention_forward(module, padded[long_rows], key[long_rows], value[long_rows], attention_mask[long_rows],
                                         *args, **kwargs)
        out[long_rows] = rest
    return layout.pack(out), weights


def supports_ragged(model: torch.nn.Module) -> bool:
    """Whether :func:`ragged_forward` applies: a model that runs transformers' SDPA attention."""
    return getattr(getattr(model, "config", None), "_attn_implementation", None) == "sdpa"


_OVERRIDE_LOCK = threading.Lock()
_OVERRIDE_USERS = [0, None, None]  # forwards inside ragged_forward across threads; the "sdpa" override they replaced; stock SDPA


@contextmanager
def ragged_forward(layout: RaggedLayout):
    """Inside the block, a forward of packed input (1, T) with a :class:`RaggedCache` and a padded 4-D mask
    (b, 1, W, S + W) attends row by row as the padded forward would, while its linear layers see T tokens.

    The ``"sdpa"`` override is installed while any thread is inside the block and passes every other
    attention call (other threads, other models) through to transformers' SDPA unchanged.
    """
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    local = ALL_ATTENTION_FUNCTIONS._local_mapping
    with _OVERRIDE_LOCK:
        if _OVERRIDE_USERS[0] == 0:
            _OVERRIDE_USERS[1], _OVERRIDE_USERS[2] = local.get("sdpa"), sdpa_attention_forward
            local["sdpa"] = _ragged_sdpa
        _OVERRIDE_USERS[0] += 1
    token = _RAGGED.set(layout)
    try:
        yield
    finally:
        _RAGGED.reset(token)
        with _OVERRIDE_LOCK:
            _OVERRIDE_USERS[0] -= 1
            if _OVERRIDE_USERS[0] == 0:
                if _OVERRIDE_USERS[1] is None:
                    local.pop("sdpa", None)
                else:
                    local["sdpa"] = _OVERRIDE_USERS[1]
