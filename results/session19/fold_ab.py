"""Session 19 probe: served rounds with and without folded GQA attention (interleaved blocks of rounds, same batch;
the engine reaches folding through `_compat.engine_attention`, which looks `fold_gqa` up at each call).

python results/session19/fold_ab.py [rows] [method ...]
"""
import contextlib
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # results/: the probes' helpers
from probes import hook_ab  # noqa: E402

from adaflash_hf import _compat  # noqa: E402

hook_ab(_compat, "fold_gqa", lambda device: contextlib.nullcontext(), ("stock", "folded"), ["plain", "adaflash@4", "adaflash@2"])
