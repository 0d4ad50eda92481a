"""What a drafter training run reports beyond its loss: the curves it plots and a check in the real engine.

``plot_curves`` draws ``curves.png`` from ``metrics.jsonl``; ``engine_check`` runs real speculative decoding
with the trained drafter on a few held-out prompts, so the summary says what the drafter does in the engine, not
only under teacher forcing.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch


def plot_curves(metrics_path: Path, out_path: Path) -> None:
    """``curves.png`` from ``metrics.jsonl``: training and held-out loss, tau, held-out acceptance by position."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = [json.loads(line) for line in metrics_path.read_text().splitlines() if line.strip()]
    train = [r for r in records if r["kind"] == "train"]
    evals = [r for r in records if r["kind"] == "eval"]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    axes[0].plot([r["step"] for r in train], [r["loss"] for r in train], label="train loss")
    if evals:
        axes[0].plot([r["step"] for r in evals], [r["loss"] for r in evals], "o-", label="held-out loss")
        axes[1].plot([r["step"] for r in evals], [r["tau"] for r in evals], "o-", label="held-out tau (teacher-forced)")
        last = evals[-1]["position_acceptance"]
        for k in range(min(4, len(last))):
            axes[2].plot(
                [r["step"] for r in evals], [r["position_acceptance"][k] for r in evals], "o-", label=f"a_{k + 1}"
            )
    axes[0].set_yscale("log")
    axes[1].plot([r["step"] for r in train], [r["train_tau"] for r in train], alpha=0.5, label="train tau")
    for ax, title in zip(axes, ("loss", "tau", "held-out acceptance by position"), strict=True):
        ax.set_xlabel("step")
        ax.set_title(title)
        ax.legend()
    fig.tight_layout()
    fig.savefig(out_path, dpi=100)
    plt.close(fig)


@torch.no_grad()
def engine_check(drafter, target, tokenizer, prompts: list[str], max_new_tokens: int) -> dict:
    """Real speculative decoding with the drafter's block alone (batch 1, greedy, whole block) on a few
    held-out prompts: tau, acceptance, speed."""
    from ..decoding.config import DraftingConfig
    from ..decoding.drafting_state import DraftingState
    from ..decoding.engine import generate
    from ..decoding.policy import FixedVerifyLength
    from .data import chat_prompt_ids

    alone = dict(
        drafting=DraftingConfig.only("drafter"), verify_policy=FixedVerifyLength(), drafting_state=DraftingState()
    )
    drafter.eval()
    tokens, spec_s, plain_s, plain_tokens = 0, 0.0, 0.0, 0
    all_stats = None
    warm = torch.tensor([chat_prompt_ids(tokenizer, prompts[0])], device=target.device)  # first calls pay one-off costs
    generate(target, drafter, warm, torch.ones_like(warm), max_new_tokens=8, **alone)
    target.generate(
        input_ids=warm,
        attention_mask=torch.ones_like(warm),
        do_sample=False,
        max_new_tokens=8,
        pad_token_id=tokenizer.pad_token_id,
    )
    for prompt in prompts:
        ids = torch.tensor([chat_prompt_ids(tokenizer, prompt)], device=target.device)
        start = time.perf_counter()
        out = generate(target, drafter, ids, torch.ones_like(ids), max_new_tokens=max_new_tokens, **alone)
        spec_s += time.perf_counter() - start
        tokens += out.num_new_tokens[0]
        if all_stats is None:
            all_stats = out.stats
        else:
            all_stats.merge(out.stats)
        start = time.perf_counter()
        plain = target.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            do_sample=False,
            max_new_tokens=max_new_tokens,
            pad_token_id=tokenizer.pad_token_id,
        )
        plain_s += time.perf_counter() - start
        plain_tokens += plain.shape[1] - ids.shape[1]
    return {
        "tau": all_stats.mean_accepted_length,
        "position_acceptance": all_stats.position_acceptance(min(8, drafter.config.block_size - 1)),
        "spec_tokens_per_s": tokens / spec_s,
        "plain_tokens_per_s": plain_tokens / plain_s,
        "num_prompts": len(prompts),
    }
