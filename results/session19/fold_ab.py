"""Session 19 probe: served rounds with and without folded GQA attention (interleaved blocks of rounds, same batch).

python results/session19/fold_ab.py [rows] [method ...]
"""
import contextlib
import pathlib
import sys

from adaflash_hf.decoding import state as state_module

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # results/: the probes' helpers
from probes import interleaved_rounds, load_smollm2, served_batch  # noqa: E402

target, tok, drafter = load_smollm2()
rows = int(sys.argv[1]) if len(sys.argv) > 1 else 16
fold = state_module.fold_gqa


def switch(mode):
    state_module.fold_gqa = fold if mode == "folded" else (lambda device: contextlib.nullcontext())


for method in sys.argv[2:] or ["plain", "adaflash@4", "adaflash@2"]:
    batch = served_batch(method, rows, target, tok, drafter)
    t = interleaved_rounds(batch, switch, ("stock", "folded"))
    switch("folded")
    print(f"{method:12s} {rows:2d} rows: stock {t['stock'] * 1e3:6.1f} ms  folded {t['folded'] * 1e3:6.1f} ms"
          f"  ratio {t['stock'] / t['folded']:.2f}", flush=True)
