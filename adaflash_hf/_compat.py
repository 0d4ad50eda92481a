"""The one place that knows which transformers version does what (STYLE rule 3).

adaflash-hf supports transformers 5.23 and 5.24. Differences it has to bridge:
- 5.24 renamed the cache keyword of model forwards from ``past_key_values`` to ``cache``;
- ``GenerationMixin._get_candidate_generator`` (private) is the only place where a third-party
  candidate generator can be selected; its name and keyword call site are stable from 4.57 to 5.24.
"""

from __future__ import annotations

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
