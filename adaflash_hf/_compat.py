"""The one place that knows which transformers version does what, and the one that touches its private API.

adaflash-hf supports transformers 5.23 and 5.24. Differences it has to bridge:
- 5.24 renamed the cache keyword of model forwards from ``past_key_values`` to ``cache``;
- ``GenerationMixin._get_candidate_generator`` (private) is the only place where a third-party
  candidate generator can be selected; its name and keyword call site are stable from 4.57 to 5.24.
- SDPA attention repeats a grouped-query model's keys and values for every query head
  (``repeat_kv``: a copy of the whole cache per layer) whenever a forward has more than one query
  token and a mask, unless ``TRANSFORMERS_SDPA_FORCE_GQA=1`` (read at each call, in both versions), and
  passes ``enable_gqa`` for a single token without a mask; on a CPU the engine's forwards fold the query
  heads into the query axis instead (:func:`folded_sdpa`, through the same ``"sdpa"`` override).
- Ragged verification (:func:`ragged_forward`) runs a batch's new tokens through the model packed
  into one row, so its linear layers see only real tokens. It relies on three things both versions
  do: a 4-D ``attention_mask`` reaches the attention function untouched, ``DynamicCache.update``
  is called with the layer's new keys and values before attention, and attention functions are
  looked up by name in ``ALL_ATTENTION_FUNCTIONS`` at each call (a local override of ``"sdpa"``).
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
_FOLD: contextvars.ContextVar[bool] = contextvars.ContextVar("adaflash_fold_gqa", default=False)


def ragged_layout() -> RaggedLayout | None:
    """The layout of the ragged forward this thread is inside (:func:`ragged_forward`), else None."""
    return _RAGGED.get()


def _stock_sdpa(module, query, key, value, attention_mask, *args, **kwargs):
    """Whatever "sdpa" was before the override: transformers' own, or another library's override."""
    return (_OVERRIDE_USERS[1] or _OVERRIDE_USERS[2])(module, query, key, value, attention_mask, *args, **kwargs)


FOLD_MIN_ROWS = 4  # below this, a forward of several query tokens per row runs as fast through SDPA's own GQA
FOLD_MAX_QUERIES = 32  # query tokens per row it was measured up to (verification, a drafter block); prefills stay stock


def folds(module, query: torch.Tensor, attention_mask: torch.Tensor | None, dropout: float = 0.0, **kwargs) -> bool:
    """Whether :func:`folded_sdpa` applies to this attention call (and measured faster than stock SDPA)."""
    groups = getattr(module, "num_key_value_groups", 1)
    b, _, q, _ = query.shape
    if groups < 2 or dropout or any(kwargs.get(k) is not None for k in ("softcap", "position_bias", "sliding_window")):
        return False
    if attention_mask is None:  # no mask: a single query, or a bidirectional block (the drafter's)
        masked_ok = q == 1 or not kwargs.get("is_causal", getattr(module, "is_causal", True))
    else:
        masked_ok = attention_mask.dim() == 4 and attention_mask.shape[1] == 1
    return masked_ok and (q == 1 or (b >= FOLD_MIN_ROWS and q <= FOLD_MAX_QUERIES))


def folded_sdpa(
    module, query, key, value, attention_mask, dropout: float = 0.0, scaling: float | None = None, **kwargs
):
    """SDPA for grouped-query attention with each key/value head's query heads folded into the query axis.

    query (b, H, q, d), key/value (b, H_kv, S, d), mask (b or 1, 1, q, S) or None -> ((b, q, H, d), None),
    as transformers' SDPA returns. Query head h reads key/value head h // g (g = H / H_kv, as ``repeat_kv``),
    so (b, H, q, d) reshapes to (b, H_kv, g*q, d) and one SDPA call over the unrepeated cache serves all g heads,
    the mask repeated for each. transformers folds this way for a single query token; for several (a verify
    or a drafter block) it repeats the cache per head or passes ``enable_gqa``, and for a single token without
    a mask it passes ``enable_gqa`` too. On a 2-core CPU (bf16 SmolLM2 shapes) one query token over 300 cached,
    one row: 0.25 -> 0.08 ms; 32 rows over 500: 16.7 -> 2.8 ms; 16 rows of 8 tokens: 1.8 -> 1.5 ms; at one row
    and 8-32 tokens it measured 0.9x, so a forward of several tokens is folded from ``FOLD_MIN_ROWS`` rows
    (``docs/research-log.md``, 2026-12-03). Each query's output is computed by the same kernel over the same
    keys, so it agrees with stock SDPA to rounding.
    """
    b, heads, q, d = query.shape
    kv_heads, groups = key.shape[1], heads // key.shape[1]
    folded = query.reshape(b, kv_heads, groups * q, d)
    mask = attention_mask
    if mask is not None:
        mask = (
            mask[:, :, None]
            .expand(mask.shape[0], 1, groups, q, mask.shape[-1])
            .reshape(mask.shape[0], 1, groups * q, -1)
        )
    out = torch.nn.functional.scaled_dot_product_attention(folded, key, value, attn_mask=mask, scale=scaling)
    return out.reshape(b, heads, q, d).transpose(1, 2).contiguous(), None


def _attend(module, query, key, value, attention_mask, *args, **kwargs):
    """Folded where it applies and this thread asked for it (:func:`fold_gqa`), else the stock SDPA."""
    if _FOLD.get() and not args and folds(module, query, attention_mask, **kwargs):
        return folded_sdpa(module, query, key, value, attention_mask, **kwargs)
    return _stock_sdpa(module, query, key, value, attention_mask, *args, **kwargs)


def _engine_sdpa(module, query, key, value, attention_mask, *args, **kwargs):
    """The ``"sdpa"`` override: ragged forwards (:func:`ragged_forward`), folded GQA (:func:`fold_gqa`), else stock.

    A ragged forward's query is packed (1, H, T, d) over the padded cache; it returns (1, T, H, d) like SDPA's
    (b, q, H, d). Where at most half the rows verify more than their anchor, the anchors of all rows attend in
    one one-query pass and only the longer rows' queries in a second (over a copy of those rows' keys and
    values); otherwise all rows attend over the padded (b, W) layout.
    """
    layout = _RAGGED.get()
    if layout is None:
        return _attend(module, query, key, value, attention_mask, *args, **kwargs)
    padded = layout.unpack_heads(query)  # (b, H, W, d)
    b, _, width, _ = padded.shape
    long_rows = layout.long_rows
    if 2 * long_rows.numel() > b:
        out, weights = _attend(module, padded, key, value, attention_mask, *args, **kwargs)  # (b, W, H, d)
        return layout.pack(out), weights
    anchors, weights = _attend(module, padded[:, :, :1], key, value, attention_mask[:, :, :1], *args, **kwargs)
    out = anchors.expand(-1, width, -1, -1).clone()  # (b, W, H, d)
    if long_rows.numel():
        rest, _ = _attend(
            module, padded[long_rows], key[long_rows], value[long_rows], attention_mask[long_rows], *args, **kwargs
        )
        out[long_rows] = rest
    return layout.pack(out), weights


def supports_ragged(model: torch.nn.Module) -> bool:
    """Whether :func:`ragged_forward` applies: a model that runs transformers' SDPA attention."""
    return getattr(getattr(model, "config", None), "_attn_implementation", None) == "sdpa"


_OVERRIDE_LOCK = threading.Lock()
# forwards inside ragged_forward across threads; the "sdpa" override they replaced; stock SDPA
_OVERRIDE_USERS = [0, None, None]


@contextmanager
def _sdpa_override():
    """Installs the ``"sdpa"`` override while any thread is inside; it passes every call that no engine forward of
    this thread asked for (other threads, other models) through to the SDPA it replaced, unchanged."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    local = ALL_ATTENTION_FUNCTIONS._local_mapping
    with _OVERRIDE_LOCK:
        if _OVERRIDE_USERS[0] == 0:
            _OVERRIDE_USERS[1], _OVERRIDE_USERS[2] = local.get("sdpa"), sdpa_attention_forward
            local["sdpa"] = _engine_sdpa
        _OVERRIDE_USERS[0] += 1
    try:
        yield
    finally:
        with _OVERRIDE_LOCK:
            _OVERRIDE_USERS[0] -= 1
            if _OVERRIDE_USERS[0] == 0:
                if _OVERRIDE_USERS[1] is None:
                    local.pop("sdpa", None)
                else:
                    local["sdpa"] = _OVERRIDE_USERS[1]


@contextmanager
def ragged_forward(layout: RaggedLayout):
    """Inside the block, a forward of packed input (1, T) with a :class:`RaggedCache` and a padded 4-D mask
    (b, 1, W, S + W) attends row by row as the padded forward would, while its linear layers see T tokens."""
    with _sdpa_override():
        token = _RAGGED.set(layout)
        try:
            yield
        finally:
            _RAGGED.reset(token)


@contextmanager
def fold_gqa(device: torch.device):
    """Inside the block, this thread's SDPA calls of grouped-query models run :func:`folded_sdpa` where it applies.

    Only on CPU, where it was measured; a CUDA build keeps transformers' kernels choice.
    """
    if device.type != "cpu":
        yield
        return
    with _sdpa_override():
        token = _FOLD.set(True)
        try:
            yield
        finally:
            _FOLD.reset(token)


@contextmanager
def engine_attention(device: torch.device, query_tokens: int):
    """The attention the engine's target and drafter forwards run under (:func:`sdpa_gqa` and :func:`fold_gqa`);
    code that times forwards for the engine (start-up calibration, ``adaflash profile``) runs under it too, so the
    costs it measures are the engine's."""
    with sdpa_gqa(device, query_tokens), fold_gqa(device):
        yield
