"""How far packed fp32 logits are from stock ones: SmolLM2-135M, a 256-token prompt then forwards of k new tokens.

python results/session14/packed_fp32_logits.py   (session 14 probe; prints max |logit difference| and whether argmaxes agree)
"""
import torch
from transformers import DynamicCache

from adaflash_hf import load_target
from adaflash_hf.kernels import is_packed, stock_linear

torch.set_num_threads(2)
model, _ = load_target("smollm2-135m", dtype="fp32")
assert is_packed(model), "fp32 packing did not measure faster here"
generator = torch.Generator().manual_seed(0)
ids = torch.randint(100, 20000, (1, 256), generator=generator)
with torch.inference_mode():
    for k in (1, 2, 4, 8, 16, 32):
        step = torch.randint(100, 20000, (1, k), generator=generator)
        logits = []
        for packed in (False, True):
            cache = DynamicCache()
            with torch.inference_mode() if packed else stock_linear(model):
                model(input_ids=ids, cache=cache, use_cache=True)
                logits.append(model(input_ids=step, cache=cache, use_cache=True).logits)
        diff = float((logits[0] - logits[1]).abs().max())
        same = bool((logits[0].argmax(-1) == logits[1].argmax(-1)).all())
        print(f"{k:>3} new tokens: max |stock - packed| {diff:.2e}, argmax identical: {same}")
