"""The one place that knows which transformers version does what (STYLE rule 3).

adaflash-hf supports transformers 5.23 and 5.24. Differences it has to bridge:
- 5.24 renamed the cache keyword of model forwards from ``past_key_values`` to ``cache``;
- ``GenerationMixin._get_candidate_generator`` (private) is the only place where a third-party
  candidate generator can be selected; its name and keyword call site are stable from 4.57 to 5.24.
- SDPA attention repeats a grouped-query model's keys and values for every query head
  (``repeat_kv``: a copy of the whole cache per layer) whenever a forward has more than one query
  token and a mask, unless ``TRANSFORMERS_SDPA_FORCE_GQA=1`` (read at each call, in both versions).
"""

from __future__ import annotations

import os
from contextlib import contextmanager

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
