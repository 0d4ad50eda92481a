"""Typed outputs of speculative generation, with the statistics users read tau and accept rate from."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class RoundStats:
    """One draft -> verify round over the rows that were still active.

    rows: original batch indices of the active rows; accept_lengths: drafts accepted per row (the
    bonus token not counted); verify_lens: tokens verified per row (anchor + drafts); sources: where
    each row's drafts came from ("drafter", "suffix", "global", or "none" for a plain step); tree:
    whether the round verified draft trees (several candidates per row) rather than chains; checked:
    per row, the drafts verified along its accepted path (a tree's accepted depth, plus one where a draft
    below it was rejected; a chain's verified drafts), None meaning ``verify_lens - 1``; draft_failures: rows
    whose drafter or length head failed this round (raised, or gave non-finite values), so they took a plain step.
    """

    rows: list[int]
    accept_lengths: list[int]
    verify_lens: list[int]
    draft_time: float
    verify_time: float
    sources: list[str] = field(default_factory=list)
    tree: bool = False
    checked: list[int] | None = None
    draft_failures: int = 0


@dataclass
class SpeculativeStats:
    """Per-round statistics of one generation call."""

    rounds: list[RoundStats] = field(default_factory=list)
    prefill_time: float = 0.0

    def add_round(self, round_stats: RoundStats) -> None:
        self.rounds.append(round_stats)

    def source_counts(self) -> dict[str, tuple[int, int]]:
        """{source: (row-rounds that used it, drafts accepted from it)}: pool these across runs."""
        counts: dict[str, tuple[int, int]] = {}
        for r in self.rounds:
            for source, accepted in zip(r.sources, r.accept_lengths):
                n, a = counts.get(source, (0, 0))
                counts[source] = (n + 1, a + accepted)
        return counts

    @property
    def draft_failures(self) -> int:
        """Row-rounds whose drafter or length head failed (each then a plain step)."""
        return sum(r.draft_failures for r in self.rounds)

    @property
    def num_rounds(self) -> int:
        return len(self.rounds)

    @property
    def mean_accepted_length(self) -> float:
        """tau: tokens produced per row per round, counting the bonus token (plain decoding = 1)."""
        lengths = [a + 1 for r in self.rounds for a in r.accept_lengths]
        return sum(lengths) / len(lengths) if lengths else 0.0

    @property
    def accept_rate(self) -> float:
        """Accepted drafts / verified drafts."""
        verified = sum(v - 1 for r in self.rounds for v in r.verify_lens)
        return sum(a for r in self.rounds for a in r.accept_lengths) / verified if verified else 0.0

    @property
    def draft_time(self) -> float:
        return sum(r.draft_time for r in self.rounds)

    @property
    def verify_time(self) -> float:
        return sum(r.verify_time for r in self.rounds)

    def position_counts(self, max_positions: int) -> tuple[list[int], list[int]]:
        """(hits, seen) for draft positions k = 1..max_positions: seen_k rounds verified draft k after
        accepting drafts 1..k-1, hits_k of them also accepted draft k. Pool these across runs."""
        hits, seen = [0] * max_positions, [0] * max_positions
        for r in self.rounds:
            checked = r.checked if r.checked is not None else [v - 1 for v in r.verify_lens]
            for a, c in zip(r.accept_lengths, checked):
                for k in range(min(c, max_positions)):
                    if k > a:
                        break
                    seen[k] += 1
                    hits[k] += k < a
        return hits, seen

    def position_acceptance(self, max_positions: int) -> list[float]:
        """P(draft k accepted | draft k verified), k = 1..max_positions; 0.0 where draft k was never verified."""
        hits, seen = self.position_counts(max_positions)
        return [h / s if s else 0.0 for h, s in zip(hits, seen)]

    def merge(self, other: SpeculativeStats) -> None:
        self.rounds.extend(other.rounds)
        self.prefill_time += other.prefill_time


@dataclass
class SpeculativeGenerateOutput:
    """Output of :func:`adaflash_hf.generate`.

    sequences: (batch, prompt_len + new) token ids laid out as ``model.generate`` returns them (the
    left-padded prompt, then the new tokens, right-padded with ``pad_token_id`` after a row ends).
    num_new_tokens: new tokens per row. stats: per-round statistics (tau, accept rate, timings).
    """

    sequences: torch.LongTensor
    num_new_tokens: list[int]
    stats: SpeculativeStats

    @property
    def mean_accepted_length(self) -> float:
        return self.stats.mean_accepted_length

    @property
    def accept_rate(self) -> float:
        return self.stats.accept_rate
