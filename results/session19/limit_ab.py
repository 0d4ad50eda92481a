"""Session 19 probe: served rounds with proposals cut at the round's verify length, and without (interleaved blocks
of rounds, same batch).

python results/session19/limit_ab.py [rows] [method ...]
"""
import pathlib
import sys

from adaflash_hf.decoding import state as state_module

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # results/: the probes' helpers
from probes import interleaved_rounds, load_smollm2, served_batch  # noqa: E402

target, tok, drafter = load_smollm2()
rows = int(sys.argv[1]) if len(sys.argv) > 1 else 16
limit = state_module.verify_limit


def switch(mode):
    state_module.verify_limit = limit if mode == "cut" else (lambda policy: None)


for method in sys.argv[2:] or ["adaflash@4", "adaflash@2"]:
    batch = served_batch(method, rows, target, tok, drafter)
    t = interleaved_rounds(batch, switch, ("uncut", "cut"))
    switch("cut")
    print(f"{method:12s} {rows:2d} rows: uncut {t['uncut'] * 1e3:6.1f} ms  cut {t['cut'] * 1e3:6.1f} ms"
          f"  ratio {t['uncut'] / t['cut']:.2f}", flush=True)
