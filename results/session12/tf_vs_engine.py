"""Teacher-forced vs engine acceptance at the same anchor positions, on recorded held-out fiction trajectories (session 12).

For each trajectory: the drafter's teacher-forced first-draft hit at every anchor (context features < a from the
recording), and the engine's (drafter alone, full block) accept count at the anchors its rounds actually used.
"""
import sys

import torch

from adaflash_hf import load_drafter, load_target
from adaflash_hf.decoding.engine import generate
from adaflash_hf.decoding.policy import FixedVerifyLength
from adaflash_hf.decoding.proposers import DraftingConfig, DraftingState
from adaflash_hf.training.step import block_hidden_states, draft_logits, to_target_ids

torch.set_num_threads(2)
target, tokenizer = load_target("smollm2-135m", dtype=sys.argv[1] if len(sys.argv) > 1 else "bf16")
drafter = load_drafter("auto", target, target_name="smollm2-135m")
_, held_out = torch.load("runs/opd_offline/fiction_200_16_64.pt", weights_only=False)
tot = {"tf_all": [], "tf_at_engine": [], "engine": []}
for h in held_out[:8]:
    tokens, p = h.tokens.long(), h.prompt_len
    T = len(tokens)
    anchors = torch.arange(p, T - 1)[None]
    with torch.no_grad():
        ctx = h.features[None].to(target.dtype)
        ctx = torch.cat([ctx, torch.zeros(1, 1, ctx.shape[-1], dtype=ctx.dtype)], 1)  # (1, T, F)
        hidden = block_hidden_states(drafter, target.get_input_embeddings(), tokens[None], ctx, anchors, 1)  # (1, A, 1, H)
        pred = to_target_ids(draft_logits(drafter, target.get_output_embeddings(), hidden[0, :, 0]).argmax(-1), drafter)
    hit = (pred == tokens[anchors[0] + 1]).tolist()  # anchor a predicts token a + 1
    hit_at = dict(zip(anchors[0].tolist(), hit))
    state = DraftingState(DraftingConfig.only("drafter"))
    ids = tokens[None, :p]
    out = generate(target, drafter, ids, torch.ones_like(ids), max_new_tokens=T - p, do_sample=False,
                   pad_token_id=tokenizer.pad_token_id, verify_policy=FixedVerifyLength(drafter.config.block_size),
                   drafting=state.config, drafting_state=state)
    same = out.sequences[0, : T].tolist() == tokens.tolist()
    pos, eng, tf_at = p, [], []
    for r in out.stats.rounds:
        a = r.accept_lengths[0]
        if pos in hit_at:
            eng.append(int(a > 0))
            tf_at.append(hit_at[pos])
        pos += a + 1
    tot["tf_all"] += hit
    tot["tf_at_engine"] += tf_at
    tot["engine"] += eng
    print(f"prompt {p} gen {T - p} same {same}: tf a1 {sum(hit) / len(hit):.3f}  at engine anchors tf {sum(tf_at) / max(1, len(tf_at)):.3f} "
          f"engine {sum(eng) / max(1, len(eng)):.3f} ({len(eng)} rounds)", flush=True)
print({k: round(sum(v) / len(v), 3) for k, v in tot.items()})
