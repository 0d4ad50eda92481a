"""``adaflash replay-drafter``: a drafter's acceptance on held-out prompts, replayed on the target's own answers.

Greedy acceptance depends only on what the drafter proposes at each anchor and on what the target would have
produced there. So once the target's greedy answers to a prompt set are cached, one target forward per answer
gives every position's context features, one drafter forward proposes a block at every position, and the rounds
of the drafter-alone engine (verify the whole block, advance past the accepted drafts and the bonus token) are a
walk over those blocks: τ per domain, acceptance by block position, with no decoding and no timing. It therefore
runs while training or data generation share the machine, compares several drafters on the same answers, and says
what ``adaflash bench --methods dflash-builtin`` would measure on the same prompts (the two differ only where a
near-tie in low precision makes batched and incremental forwards choose differently).

Two figures per domain:
- ``tau``: the walk, the engine's τ. Its anchors are the tokens just after each round's accepted drafts, so it
  weights the positions a drafter has just missed more than a uniform draw does;
- ``tau_every_anchor``: every response position as an anchor, as ``train-drafter``'s held-out estimate draws
  anchors (uniformly); higher wherever easy stretches run long.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from ..cli_args import (
    DTYPES,
    check_choice,
    command_line,
    domains_field,
    dtype_field,
    eval_prompts_field,
    json_field,
    num_threads_field,
    target_field,
)
from ..targets import DEFAULT_TARGET

if TYPE_CHECKING:
    import torch

logger = logging.getLogger(__name__)


@dataclass
class ReplayDrafterArgs:
    """``adaflash replay-drafter``: drafter-alone τ of one or more drafters on the target's cached greedy answers."""

    drafters: str = field(
        default="auto",
        metadata={
            "help": "Comma-separated drafters to compare on the same answers: 'auto' (the preset's bundled drafter), "
            "local folders (a train-drafter output or checkpoint folder) or Hub ids."
        },
    )
    target: str = target_field(DEFAULT_TARGET)
    prompts: str = eval_prompts_field()
    domains: str = domains_field("code,math,chat,news")
    num_prompts: int = field(default=8, metadata={"help": "Prompts per domain (preset eval set) or in total (JSONL)."})
    max_new_tokens: int = field(default=96, metadata={"help": "Length of the target's greedy answers."})
    dtype: str = dtype_field()
    num_threads: int | None = num_threads_field()
    responses_dir: str | None = field(
        default=None,
        metadata={
            "help": "Where the target's answers are cached, one folder per prompt set (default: "
            "<adaflash cache>/replay/<target>)."
        },
    )
    json: str = json_field("", "the JSON results ('' to skip)")

    def __post_init__(self) -> None:
        if not self.drafter_list:
            raise ValueError("--drafters is empty: name at least one drafter, e.g. --drafters auto.")
        if self.num_prompts < 1:
            raise ValueError(f"num_prompts must be >= 1, got {self.num_prompts}.")
        if self.max_new_tokens < 2:
            raise ValueError(
                f"max_new_tokens must be >= 2 (a round needs an anchor and a token), got {self.max_new_tokens}."
            )
        check_choice("dtype", self.dtype, DTYPES)
        from ..drafters import checked_drafter_source

        for name in self.drafter_list:
            if name not in ("auto", "fresh"):
                checked_drafter_source(name)  # a typo fails here, before the target loads

    @property
    def drafter_list(self) -> list[str]:
        return [d.strip() for d in self.drafters.split(",") if d.strip()]


def walk(accepted: list[int]) -> list[int]:
    """The anchors of the drafter-alone engine's rounds over blocks proposed at every response position:
    ``accepted[i]`` leading drafts of the block at position i match the target, and a round at i moves on to
    i + accepted[i] + 1 (past the accepted drafts and the bonus token). A block reaches at most the answer's last
    token, so ``accepted[i] <= len(accepted) - i``."""
    anchors, i = [], 0
    while i < len(accepted):
        anchors.append(i)
        i += accepted[i] + 1
    return anchors


def block_acceptance(drafter, target, sequence, pad_token_id: int) -> torch.Tensor:
    """(A, K) bool: for each response anchor of ``sequence`` (a :class:`TrainingSequence` of prompt + greedy answer),
    whether the drafter's block matches the target's greedy token at positions 1..K, leading positions first."""
    import torch

    from .data import IGNORE_INDEX, collate, target_features
    from .losses import position_weights
    from .step import drafter_block_forward

    batch = collate([sequence], pad_token_id)
    with torch.no_grad():
        features = target_features(target, batch, drafter.config.target_layer_ids)
    anchors = torch.arange(int(sequence.start), len(sequence.input_ids) - 1, device=features.context.device)[None]
    if anchors.numel() == 0:
        return torch.zeros(0, drafter.config.block_size - 1, dtype=torch.bool)
    valid = torch.ones_like(anchors, dtype=torch.bool)
    weights = position_weights(drafter.config.block_size, 1.0)
    with torch.no_grad():
        out = drafter_block_forward(drafter, target, batch, features, anchors, valid, weights, consistent_labels=True)
    labels, predictions = out.labels[0].cpu(), out.predictions[0].cpu()
    return ((predictions == labels) & (labels != IGNORE_INDEX)).long().cumprod(-1).bool()


def replay_stats(matches: list[torch.Tensor]) -> dict:
    """Over answers' (A, K) block matches (A = answer length - 1 anchors): ``tau`` as ``adaflash bench`` counts it
    (new tokens per target forward, the prefill that gives the first token included), ``tau_every_anchor`` (1 +
    mean accepted drafts over all anchors) and the walk's acceptance by block position (of the rounds whose
    earlier positions all matched, the share that matched there)."""
    import torch

    k = matches[0].shape[1] if matches else 0
    hits, seen = torch.zeros(k), torch.zeros(k)
    rounds = tokens = 0
    every: list[int] = []
    for match in matches:
        accepted = match.sum(-1).tolist()
        every += accepted
        anchors = walk(accepted)
        rounds += len(anchors)
        tokens += len(accepted) + 1
        for anchor in anchors:
            has_label = torch.arange(k) < len(accepted) - anchor  # block positions still inside the answer
            prefix = torch.cat([torch.ones(1, dtype=torch.bool), match[anchor, :-1]])
            seen += (prefix & has_label).float()
            hits += (match[anchor] & has_label).float()
    return {
        "tau": tokens / max(1, rounds + len(matches)),
        "tau_every_anchor": 1 + sum(every) / max(1, len(every)),
        "position_acceptance": (hits / seen.clamp_min(1)).tolist(),
        "answers": len(matches),
        "tokens": tokens,
        "rounds": rounds,
    }


def run_replay_drafter(args: ReplayDrafterArgs) -> int:
    import torch

    from .._pypi import cache_home
    from ..data import benchmark_prompts
    from ..drafters import load_drafter
    from ..provenance import machine_summary
    from ..targets import load_target
    from .data import generate_responses

    if args.num_threads is not None:
        torch.set_num_threads(args.num_threads)
    target, tokenizer = load_target(args.target, dtype=args.dtype)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    prompts = benchmark_prompts(args.prompts, args.domains, args.num_prompts)
    safe = "".join(c if c.isalnum() or c in "-._" else "_" for c in args.target)
    root = Path(args.responses_dir) if args.responses_dir else cache_home() / "replay" / safe
    by_domain: dict[str, list] = {}
    for domain in dict.fromkeys(p["domain"] for p in prompts):
        texts = [p["prompt"] for p in prompts if p["domain"] == domain]
        by_domain[domain] = generate_responses(
            target, tokenizer, texts, root, max_new_tokens=args.max_new_tokens, batch_size=8, target_name=args.target
        )
    results = []
    for name in args.drafter_list:
        drafter = load_drafter(name, target, args.target, datastore=False)
        start = time.perf_counter()
        matches = {d: [block_acceptance(drafter, target, s, pad_id) for s in seqs] for d, seqs in by_domain.items()}
        for domain, domain_matches in [*matches.items(), ("all", [m for ms in matches.values() for m in ms])]:
            results.append({"drafter": name, "domain": domain, **replay_stats(domain_matches)})
        logger.info("%s replayed in %.0f s", name, time.perf_counter() - start)
    print_replay_table(results)
    if args.json:
        report = {
            "command": command_line("replay-drafter", args),
            "machine": machine_summary(),
            "args": asdict(args),
            "results": results,
        }
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
        print(f"wrote {args.json}")
    return 0


def print_replay_table(results: list[dict]) -> None:
    domains = list(dict.fromkeys(r["domain"] for r in results))
    width = max(len(r["drafter"]) for r in results)
    print(f"{'drafter':<{width}}  " + "  ".join(f"{d:>6}" for d in domains) + "  every anchor  acceptance (walk)")
    for name in dict.fromkeys(r["drafter"] for r in results):
        rows = {r["domain"]: r for r in results if r["drafter"] == name}
        overall = rows["all"]
        acceptance = " ".join(f"{a:.2f}" for a in overall["position_acceptance"][:4])
        taus = "  ".join(f"{rows[d]['tau']:>6.3f}" for d in domains)
        print(f"{name:<{width}}  {taus}  {overall['tau_every_anchor']:>12.3f}  {acceptance}")
