"""Session 10 probe: one SmolLM2 bf16 forward of 1..16 new tokens (200-token cache, no mask), stock F.linear against packed weights.

python results/session10/packed_forward.py   (idle machine, 2 threads)
"""
import torch, time
from adaflash_hf import load_target
torch.set_num_threads(2)
target, tok = load_target("smollm2-135m", dtype="bf16")
class Packed(torch.nn.Module):
    def __init__(self, lin):
        super().__init__()
        self.w = torch.ops.mkldnn._reorder_linear_weight(lin.weight.detach(), 16)
        self.b = lin.bias
        self.out_features = lin.out_features
    def forward(self, x):
        return torch.ops.mkldnn._linear_pointwise(x, self.w, self.b, "none", [], "")
def timeit(model):
    ids = torch.randint(0, 40000, (1, 200))
    res = {}
    with torch.inference_mode():
        cache = model(ids, use_cache=True).past_key_values
        for M in (1,2,4,8,16):
            x = torch.randint(0,40000,(1,M)); ts=[]
            for r in range(15):
                t=time.perf_counter(); out = model(x, cache=cache, use_cache=True); ts.append(time.perf_counter()-t); cache.crop(-M)
            ts.sort(); res[M]=ts[len(ts)//2]*1e3
    return res, out.logits
a, la = timeit(target)
import copy
t2 = copy.deepcopy(target)
for name, mod in list(t2.named_modules()):
    for cn, ch in list(mod.named_children()):
        if isinstance(ch, torch.nn.Linear):
            setattr(mod, cn, Packed(ch))
b, lb = timeit(t2)
a2, _ = timeit(target)
for M in a: print(M, f"stock {a[M]:.1f} / {a2[M]:.1f}  packed {b[M]:.1f}")
