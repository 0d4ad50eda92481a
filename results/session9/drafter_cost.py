"""What one drafter pass costs at batch 1, by draft-vocabulary size, against a one-token target step.

python results/session9/drafter_cost.py [dtype]    (session 9 probe; idle machine, 2 threads)
"""
import sys
import time

import torch
from transformers import DynamicCache

from adaflash_hf import load_target
from adaflash_hf.decoding.proposers import DraftHead, top_probs_and_tokens
from adaflash_hf.decoding.state import context_features, draft_block
from adaflash_hf.drafters import load_drafter

torch.set_num_threads(2)
dtype = sys.argv[1] if len(sys.argv) > 1 else "bf16"
target, _ = load_target("smollm2-135m", dtype=dtype)
drafter = load_drafter("auto", target, target_name="smollm2-135m")
embed = target.get_input_embeddings()
ids = torch.randint(100, 20000, (1, 256))


def median_ms(fn, n=30):
    for _ in range(5):
        fn()
    times = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return sorted(times)[n // 2] * 1000


with torch.inference_mode():
    out = target(input_ids=ids, output_hidden_states=True, use_cache=True)
    feats = context_features(out.hidden_states, drafter.config.target_layer_ids)
    cache = DynamicCache()
    draft_block(drafter, embed, ids[:, -1], feats[:, :254], torch.arange(254)[None], torch.tensor([255]),
                torch.ones(1, 254, dtype=torch.long), cache)
    past = out.past_key_values

    def target_step():
        target(input_ids=ids[:, :1], position_ids=torch.tensor([[256]]), cache=past, use_cache=True)
        past.crop(-1)

    def drafter_layer():
        hidden = draft_block(drafter, embed, ids[:, -1], feats[:, 254:256], torch.tensor([[254, 255]]), torch.tensor([256]),
                             torch.ones(1, 256, dtype=torch.long), cache)
        cache.crop(-2)
        return hidden

    step, layer = median_ms(target_step), median_ms(drafter_layer)
    hidden = draft_block(drafter, embed, ids[:, -1], feats[:, 254:256], torch.tensor([[254, 255]]), torch.tensor([256]),
                         torch.ones(1, 256, dtype=torch.long), cache)
    print(f"target step (1 token, cache 256): {step:.2f} ms; draft layer (2 new context + 8-token block): {layer:.2f} ms")
    full = drafter.draft_vocab
    for size in (32768, 16384, 8192, 4096):
        head = DraftHead(target.get_output_embeddings(), full[:size])
        ms = median_ms(lambda head=head: top_probs_and_tokens(head, hidden[:, 1:]))
        print(f"draft head over {size:>5} tokens x 7 positions (logits, top-1, softmax): {ms:.2f} ms")
