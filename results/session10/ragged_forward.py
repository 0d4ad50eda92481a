"""Session 10 probe: a 16-row (or N-row) forward where k rows verify 9 tokens and the rest 1, ragged against padded.

python results/session10/ragged_forward.py 16   (idle machine, 2 threads, bf16, 200-token caches)
"""
import torch, time, sys
from adaflash_hf import load_target
from adaflash_hf._compat import RaggedCache, RaggedLayout, ragged_forward, CACHE_KWARG, sdpa_gqa
from adaflash_hf.decoding.tree import tree_attention_mask
torch.set_num_threads(2)
target, tok = load_target("smollm2-135m", dtype="bf16")
b, S, g = int(sys.argv[1]) if len(sys.argv) > 1 else 16, 200, 8
ids = torch.randint(0, 40000, (b, S)); mask = torch.ones(b, S, dtype=torch.long)
cache = RaggedCache()
with torch.inference_mode():
    target(input_ids=ids, attention_mask=mask, use_cache=True, **{CACHE_KWARG: cache})
    def run(lengths, width, ragged, reps=7):
        vids = torch.randint(0, 40000, (b, width)); pos = S + torch.arange(width)[None].expand(b, -1)
        chain = torch.arange(width - 1)[None].expand(b, -1)
        attn = tree_attention_mask(mask, chain, target.dtype)
        ts = []
        for _ in range(reps):
            t = time.perf_counter()
            if ragged:
                layout = RaggedLayout.from_lengths(lengths, width)
                with sdpa_gqa(torch.device("cpu"), width), ragged_forward(layout):
                    out = target(input_ids=layout.pack(vids), position_ids=layout.pack(pos), attention_mask=attn, use_cache=True, **{CACHE_KWARG: cache})
                layout.unpack(out.logits)
            else:
                with sdpa_gqa(torch.device("cpu"), width):
                    target(input_ids=vids, position_ids=pos, attention_mask=attn if width > 1 else torch.cat([mask, torch.ones(b, 1, dtype=torch.long)], 1), use_cache=True, **{CACHE_KWARG: cache})
            ts.append(time.perf_counter() - t)
            cache.crop(-width)
        return sorted(ts)[reps // 2] * 1e3
    plain = run(torch.ones(b, dtype=torch.long), 1, False)
    padded = run(None, g + 1, False)
    for k in (1, 2, 4, 8):
        lengths = torch.tensor([g + 1] * k + [1] * (b - k))
        r = run(lengths, g + 1, True)
        print(f"b={b}: {k} rows verify {g+1}, rest 1 ({int(lengths.sum())} tokens): ragged {r:.1f} ms vs padded {padded:.1f} ms; plain step {plain:.1f} ms")
    print(f"all rows {g+1}: ragged {run(torch.full((b,), g+1), g+1, True):.1f} ms")
