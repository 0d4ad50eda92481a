"""Replay probe: scale each row's estimated acceptance by how its own rounds so far compared with the estimates.

python results/session17/sim_calibration.py [strength ...]   (needs results/session9/simulate.py's cache)

Per row, f = (accepted + k) / (predicted + k) over its rounds (decayed), k = 2; the verify length is then chosen
from rates whose first entry is multiplied by f ** strength (so every node's reach probability scales by it).
"""
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "session9"))
import simulate  # noqa: E402

from adaflash_hf.decoding import policy as policy_module  # noqa: E402
from adaflash_hf.decoding.proposers import HybridProposer  # noqa: E402

STATE = {"acc": 0.0, "pred": 0.0, "last": 0.0, "strength": 0.0}
base_lens = policy_module.GoodputVerifyLength.verify_lens
base_record, base_add = HybridProposer.record, HybridProposer.add_row


def verify_lens(self, rates, hidden, sources=None):
    f = ((STATE["acc"] + 2) / (STATE["pred"] + 2)) ** STATE["strength"]
    scaled = rates.clone()
    if scaled.shape[1]:
        scaled[:, 0] = (scaled[:, 0] * f).clamp(max=1.0)
    lens = base_lens(self, scaled, hidden, sources)
    g = int(lens[0]) - 1
    STATE["last"] = float(rates[0, :g].float().cumprod(-1).sum()) if g > 0 else 0.0
    return lens


def record(self, row_ids, chunks):
    STATE["acc"] = 0.9 * STATE["acc"] + len(chunks[0]) - 1
    STATE["pred"] = 0.9 * STATE["pred"] + STATE["last"]
    return base_record(self, row_ids, chunks)


def add_row(self, row, tokens):
    STATE.update(acc=0.0, pred=0.0)
    return base_add(self, row, tokens)


policy_module.GoodputVerifyLength.verify_lens = verify_lens
HybridProposer.record, HybridProposer.add_row = record, add_row
rows = json.loads(simulate.CACHE.read_text())
spec = "sources=suffix+global+datastore+drafter,prior=adaflash_hf/bundled/smollm2-135m/acceptance_prior.json"
for strength in map(float, sys.argv[1:] or ["0", "0.5", "1"]):
    STATE["strength"] = strength
    res = simulate.simulate(rows, simulate.parse(spec))
    print(f"strength {strength}: " + "  ".join(f"{d} {v['speedup']:.3f}x tau {v['tau']:.2f}" for d, v in res.items()), flush=True)
