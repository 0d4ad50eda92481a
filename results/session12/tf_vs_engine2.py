"""Capture the engine's drafter calls and compare each block's first draft with the teacher-forced one at that anchor."""
import sys

import torch

from adaflash_hf import load_drafter, load_target
from adaflash_hf.decoding.engine import generate
from adaflash_hf.decoding.policy import FixedVerifyLength
from adaflash_hf.decoding.proposers import DraftingConfig, DraftingState
from adaflash_hf.training.step import block_hidden_states, draft_logits, to_target_ids

torch.set_num_threads(2)
dtype = sys.argv[1] if len(sys.argv) > 1 else "bf16"
target, tokenizer = load_target("smollm2-135m", dtype=dtype)
drafter = load_drafter("auto", target, target_name="smollm2-135m")
_, held_out = torch.load("runs/opd_offline/fiction_200_16_64.pt", weights_only=False)
calls = []


def hook(module, args, kwargs, output):
    calls.append((kwargs["position_ids"].clone(), kwargs["context_hidden_states"].shape[1], output.last_hidden_state.detach().clone()))


handle = drafter.register_forward_hook(hook, with_kwargs=True)
h = held_out[1]
tokens, p = h.tokens.long(), h.prompt_len
T = len(tokens)
state = DraftingState(DraftingConfig.only("drafter"))
ids = tokens[None, :p]
out = generate(target, drafter, ids, torch.ones_like(ids), max_new_tokens=T - p, do_sample=False,
               pad_token_id=tokenizer.pad_token_id, verify_policy=FixedVerifyLength(drafter.config.block_size),
               drafting=state.config, drafting_state=state)
handle.remove()
seq = out.sequences[0]
print("engine same as recorded:", seq[:T].tolist() == tokens.tolist(), "drafter calls", len(calls))
head = target.get_output_embeddings()
# teacher-forced with features recomputed by a plain target forward over the engine's own sequence
from adaflash_hf.decoding.state import context_features  # noqa: E402
with torch.no_grad():
    fwd = target(input_ids=seq[None], output_hidden_states=True, use_cache=False)
    ctx = context_features(fwd.hidden_states, drafter.config.target_layer_ids)
    agree = 0
    for k, (pos, nctx, hidden) in enumerate(calls[:40]):
        a = int(pos[0, -drafter.config.block_size])
        eng = to_target_ids(draft_logits(drafter, head, hidden[0, 1:2]).argmax(-1), drafter)
        tf_hidden = block_hidden_states(drafter, target.get_input_embeddings(), seq[None, : a + 8], ctx[:, : a + 8], torch.tensor([[a]]), 1)
        tf = to_target_ids(draft_logits(drafter, head, tf_hidden[0, 0]).argmax(-1), drafter)
        agree += int(eng == tf)
        if k < 12:
            print(f"call {k}: anchor {a} ctx fed {nctx} ctx positions {pos[0, :nctx].tolist()[:3]}..{pos[0, :nctx].tolist()[-2:]} "
                  f"engine draft {eng.item()} tf draft {tf.item()} next token {seq[a + 1].item()}")
    print(f"first drafts equal in {agree} of {min(40, len(calls))} calls")
