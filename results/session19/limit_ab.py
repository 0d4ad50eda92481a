"""Session 19 probe: served rounds with proposals cut at the round's verify length, and without (interleaved blocks
of rounds, same batch).

python results/session19/limit_ab.py [rows] [method ...]
"""
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # results/: the probes' helpers
from probes import hook_ab  # noqa: E402

from adaflash_hf.decoding import state  # noqa: E402

hook_ab(state, "verify_limit", lambda policy: None, ("uncut", "cut"), ["adaflash@4", "adaflash@2"])
