"""The engine's acceptance records that the length head is trained on.

Records. The real engine (:func:`adaflash_hf.generate`) decodes training prompts with the drafter as
the only draft source and a policy that verifies the whole block every round
(:class:`RecordingVerifyLength`), so labels are censored only by ``max_new_tokens``. Every round and
row yields the drafter's hidden states for the block (what the head reads), the drafter's top-1
probabilities and the engine estimator's rates (what the existing policy reads, and the head's
prior), the number of drafts verified and the number accepted. Records are cached as safetensors
shards keyed by what produced them; a rerun reuses finished shards.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from tqdm.auto import tqdm
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from ..decoding.config import DraftingConfig
from ..decoding.draft_head import DraftHead, top_probs_and_tokens
from ..decoding.drafting_state import DraftingState
from ..decoding.policy import FixedVerifyLength

logger = logging.getLogger(__name__)

SHARD_PROMPTS = 32  # prompts per cached record shard


@dataclass
class AcceptanceRecords:
    """One row per (request, round) in which the drafter's block was verified.

    draft_hidden_states (N, B, H) the drafter's block states; top_probs (N, B-1) its top-1 probability
    per draft; rates (N, B-1) the engine estimator's conditional acceptance estimates the policy
    received; accept_lengths (N,) accepted drafts; num_verified (N,) drafts verified; shards (N,) the
    shard (group of whole prompts) a row came from, for analyses by prompt group.
    """

    draft_hidden_states: torch.Tensor
    top_probs: torch.Tensor
    rates: torch.Tensor
    accept_lengths: torch.Tensor
    num_verified: torch.Tensor
    shards: torch.Tensor

    def __len__(self) -> int:
        return self.accept_lengths.shape[0]

    def select(self, index: torch.Tensor) -> AcceptanceRecords:
        return AcceptanceRecords(**{k: v[index] for k, v in asdict_tensors(self).items()})

    @classmethod
    def cat(cls, parts: list[AcceptanceRecords]) -> AcceptanceRecords:
        return cls(**{k: torch.cat([asdict_tensors(p)[k] for p in parts]) for k in asdict_tensors(parts[0])})

    def save(self, path: Path) -> None:
        tmp = path.with_suffix(".tmp")
        save_file({k: v.contiguous() for k, v in asdict_tensors(self).items()}, str(tmp))
        tmp.replace(path)

    @classmethod
    def load(cls, path: Path) -> AcceptanceRecords:
        return cls(**load_file(str(path)))


def asdict_tensors(records: AcceptanceRecords) -> dict[str, torch.Tensor]:
    return {name: getattr(records, name) for name in records.__dataclass_fields__}


class RecordingVerifyLength:
    """Verifies every proposal whole (labels uncensored) and keeps what a length policy saw each round.

    The engine calls ``verify_lens`` then ``update`` once per round with the same rows in the same
    order, so the pair is one record per row. Rounds without the drafter's block are skipped.
    """

    def __init__(self):
        self.policy = FixedVerifyLength()
        self.rounds: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]] = []
        self._seen: tuple[torch.Tensor, torch.Tensor | None] | None = None

    def verify_lens(
        self, rates: torch.Tensor, draft_hidden_states: torch.Tensor | None, sources: list[str] | None = None
    ) -> torch.Tensor:
        self._seen = (rates, draft_hidden_states)
        return self.policy.verify_lens(rates, draft_hidden_states, sources)

    def update(
        self, accept_lengths: torch.Tensor, verify_lens: torch.Tensor, seconds: float, proposed: bool | None = None
    ) -> None:
        rates, hidden = self._seen
        if hidden is not None:
            num_drafts = hidden.shape[1] - 1
            self.rounds.append(
                (
                    hidden.detach().cpu(),
                    rates[:, :num_drafts].float().cpu(),
                    accept_lengths.cpu().long(),
                    verify_lens.cpu().long() - 1,
                )
            )

    def pop_records(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """(hidden (N, B, H), rates (N, B-1), accept_lengths (N,), num_verified (N,)) of the rounds seen, cleared."""
        hidden, rates, accepted, verified = (torch.cat(parts) for parts in zip(*self.rounds))
        self.rounds = []
        keep = verified > 0  # a row with one token of budget left verifies nothing: no label
        return hidden[keep], rates[keep], accepted[keep], verified[keep]


class AlwaysDraftState(DraftingState):
    """A :class:`DraftingState` whose drafter runs every round (the default one skips it when it does not seem
    to pay), so every round of every row yields a record."""

    def __init__(self):
        super().__init__(DraftingConfig.only("drafter"))

    def drafter_pays(self, best_other, width) -> bool:
        return True


def _estimator_counts(state: DraftingState) -> list:
    return [
        [source, list(feature), state.estimator.hits.get((source, feature), 0.0), seen]
        for (source, feature), seen in state.estimator.seen.items()
    ]


def _restore_estimator(state: DraftingState, counts: list) -> None:
    for source, feature, hits, seen in counts:
        state.estimator.hits[(source, tuple(feature))] = hits
        state.estimator.seen[(source, tuple(feature))] = seen


def drafter_fingerprint(drafter: PreTrainedModel) -> str:
    """Identifies the drafter's weights cheaply (its context projection), so a new drafter gets new records."""
    return hashlib.sha256(drafter.fc.weight.detach().float().cpu().numpy().tobytes()).hexdigest()[:16]


@torch.no_grad()
def drafter_top_probs(
    target: PreTrainedModel, drafter: PreTrainedModel, hidden: torch.Tensor, chunk: int = 128
) -> torch.Tensor:
    """The drafter's top-1 probability of each draft (N, B-1), from its block states (N, B, H), as the engine
    computes it."""
    head = DraftHead(target.get_output_embeddings(), drafter.draft_vocab)
    parts = [
        top_probs_and_tokens(head, hidden[i : i + chunk, 1:].to(target.device, target.dtype))[1].float().cpu()
        for i in range(0, hidden.shape[0], chunk)
    ]
    return torch.cat(parts)


def collect_records(
    target: PreTrainedModel,
    drafter: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    prompts: list[str],
    cache_dir: str | Path,
    state: DraftingState,
    *,
    key: str,
    max_new_tokens: int = 96,
    batch_size: int = 8,
    shard_size: int = SHARD_PROMPTS,
    max_prompt_tokens: int = 512,
    max_minutes: float | None = None,
    desc: str = "record acceptance",
) -> AcceptanceRecords | None:
    """Decode ``prompts`` with the real engine (drafter only, whole blocks verified) and return its records.

    Shards of ``shard_size`` prompts are cached under ``cache_dir/<hash of key and prompts>/``; a rerun
    loads them, and the estimator counts saved after each shard continue where they stopped.
    ``max_minutes`` stops after the shard that crosses it. None when nothing was recorded.
    """
    from ..decoding.engine import generate
    from ..prompting import chat_prompt_ids
    from .data import _left_pad

    digest = hashlib.sha256("\0".join([key, *prompts]).encode()).hexdigest()[:16]
    cache_dir = Path(cache_dir) / digest
    cache_dir.mkdir(parents=True, exist_ok=True)
    meta_path = cache_dir / "meta.json"
    meta = (
        json.loads(meta_path.read_text())
        if meta_path.exists()
        else {"key": key, "num_prompts": len(prompts), "shards": {}}
    )
    encoded = [chat_prompt_ids(tokenizer, p) for p in prompts]
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    parts, start_time = [], time.perf_counter()
    num_shards = (len(prompts) + shard_size - 1) // shard_size
    bar = tqdm(total=len(prompts), desc=desc, unit="prompt")
    for shard in range(num_shards):
        path = cache_dir / f"shard_{shard:05d}.safetensors"
        indices = range(shard * shard_size, min((shard + 1) * shard_size, len(prompts)))
        if path.exists():
            parts.append(AcceptanceRecords.load(path))
            _restore_estimator(state, meta["shards"][path.name]["estimator"])  # the counts after this shard
            bar.update(len(indices))
            continue
        if max_minutes is not None and (time.perf_counter() - start_time) / 60 >= max_minutes:
            break
        shard_start = time.perf_counter()
        recorder = RecordingVerifyLength()
        kept = sorted((i for i in indices if len(encoded[i]) <= max_prompt_tokens), key=lambda i: len(encoded[i]))
        for lo in range(0, len(kept), batch_size):
            input_ids, attention_mask = _left_pad([encoded[i] for i in kept[lo : lo + batch_size]], pad_id)
            generate(
                target,
                drafter,
                input_ids.to(target.device),
                attention_mask.to(target.device),
                max_new_tokens=max_new_tokens,
                do_sample=False,
                pad_token_id=pad_id,
                verify_policy=recorder,
                drafting=state.config,
                drafting_state=state,
            )
            bar.update(min(batch_size, len(kept) - lo))
        bar.update(len(indices) - len(kept))
        if not recorder.rounds:
            continue
        hidden, rates, accepted, verified = recorder.pop_records()
        records = AcceptanceRecords(
            hidden.to(torch.bfloat16),
            drafter_top_probs(target, drafter, hidden),
            rates,
            accepted,
            verified,
            torch.full_like(accepted, shard),
        )
        meta["shards"][path.name] = {
            "prompts": len(kept),
            "records": len(records),
            "seconds": round(time.perf_counter() - shard_start, 1),
            "estimator": _estimator_counts(state),
        }
        meta_path.write_text(json.dumps(meta, indent=1))  # before the shard: a shard on disk always has its entry
        records.save(path)
        parts.append(records)
    bar.close()
    return AcceptanceRecords.cat(parts) if parts else None
