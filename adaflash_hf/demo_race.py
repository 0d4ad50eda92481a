"""The race behind ``adaflash demo``: plain decoding and AdaFlash on one prompt, on the engine core.

Both sides are one-row :class:`~adaflash_hf.decoding.state.SpeculativeBatch` es over the same target,
prompt ids and sampling; the side that has spent less compute time so far steps next (:func:`race`).
:func:`token_spans` cuts a side's text into runs of one draft source. No web imports: the page in
:mod:`adaflash_hf.demo` renders what this module yields.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .decoding.state import RowSpec, SpeculativeBatch

TARGET = "target"  # label of the token the target produces itself at the end of every round


@dataclass
class Span:
    """A run of generated text whose tokens came from one source; ``num_tokens`` tokens make ``text``."""

    text: str
    source: str
    num_tokens: int


class Side:
    """One decoding path of the race: a one-row :class:`SpeculativeBatch`, the tokens it produced with
    the source of each, its per-round statistics and the compute time it spent."""

    def __init__(self, name: str, target, drafter=None, **batch_kwargs):
        from .decoding.outputs import SpeculativeStats
        from .decoding.state import SpeculativeBatch

        self.name = name
        self.stats = SpeculativeStats()
        self.batch: SpeculativeBatch = SpeculativeBatch(target, drafter, on_round=self.stats.add_round, **batch_kwargs)
        self.tokens: list[int] = []
        self.sources: list[str] = []  # per token: the draft source it was accepted from, or TARGET
        self.seconds = 0.0
        self.finish_reason: str | None = None

    def advance(self, spec: RowSpec | None = None) -> None:
        """Prefill ``spec`` (its first token), or run one round; time it and label the new tokens."""
        start = time.perf_counter()
        (update,) = self.batch.add_rows([spec]) if spec is not None else self.batch.step()
        self.seconds += time.perf_counter() - start
        accepted = 0 if update.source == "prefill" else self.stats.rounds[-1].accept_lengths[0]
        # accepted drafts, then the target's own token; a chunk cut at a stop id or the budget is a prefix
        self.sources += ([update.source] * accepted + [TARGET])[: len(update.tokens)]
        self.tokens += update.tokens
        self.finish_reason = update.finish_reason

    @property
    def tau(self) -> float:
        """Tokens per round (plain decoding: 1); 0 before the first round."""
        return self.stats.mean_accepted_length

    @property
    def tokens_per_second(self) -> float:
        return len(self.tokens) / self.seconds if self.seconds else 0.0

    @property
    def verify_lens(self) -> list[int]:
        """Tokens verified in each round (anchor + drafts)."""
        return [r.verify_lens[0] for r in self.stats.rounds]

    @property
    def round_sources(self) -> list[str]:
        return [r.sources[0] for r in self.stats.rounds]


@dataclass
class Race:
    """Both sides of one comparison, as they stand after the latest step."""

    plain: Side
    adaflash: Side
    spec: RowSpec

    @property
    def done(self) -> bool:
        return self.plain.finish_reason is not None and self.adaflash.finish_reason is not None

    @property
    def speedup(self) -> float | None:
        """AdaFlash tokens per second over plain tokens per second (None until both have run)."""
        if not self.plain.tokens_per_second or not self.adaflash.tokens_per_second:
            return None
        return self.adaflash.tokens_per_second / self.plain.tokens_per_second

    @property
    def first_difference(self) -> int | None:
        """The first new token where the two texts differ; None while one is a prefix of the other."""
        a, b = self.plain.tokens, self.adaflash.tokens
        index = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
        if index is None and self.done and len(a) != len(b):
            index = min(len(a), len(b))
        return index


def race(target, drafter, spec: RowSpec, *, drafting_state=None, verify_policy=None, seed: int = 0) -> Iterator[Race]:
    """Decode ``spec`` with the target alone and with AdaFlash, taking turns; yields after every step.

    drafting_state / verify_policy: the AdaFlash side's (default: the target's shared drafting state
    and its goodput policy). The plain side gets a fresh state and a verify length of 1 every round.
    Whichever running side has spent less compute time steps next, so both advance at their own speed.
    """
    import torch

    from .decoding.config import DraftingConfig
    from .decoding.drafting_state import DraftingState
    from .decoding.policy import FixedVerifyLength

    plain_drafting = DraftingConfig(drafter=False, suffix=True, global_index=False, datastore=False)  # never verified
    plain = Side(
        "plain",
        target,
        drafting=plain_drafting,
        drafting_state=DraftingState(plain_drafting),
        verify_policy=FixedVerifyLength(1),
        generator=torch.Generator().manual_seed(seed),
    )
    adaflash = Side(
        "adaflash",
        target,
        drafter,
        drafting_state=drafting_state,
        verify_policy=verify_policy,
        generator=torch.Generator().manual_seed(seed),
    )
    progress = Race(plain, adaflash, spec)
    for side in (plain, adaflash):
        side.advance(spec)
    yield progress
    while not progress.done:
        min((s for s in (plain, adaflash) if s.finish_reason is None), key=lambda s: s.seconds).advance()
        yield progress


def token_spans(tokenizer, tokens: Sequence[int], sources: Sequence[str]) -> list[Span]:
    """Text of ``tokens`` cut into runs of one source; every token lies in exactly one span.

    Decoded incrementally (special tokens skipped), so the spans' text joins to the full decode even
    when a character's bytes are split across tokens; such a character goes to its last token's span.
    """
    from .detokenizer import IncrementalDetokenizer

    detokenizer = IncrementalDetokenizer(tokenizer)
    spans: list[Span] = []
    waiting = 0  # tokens whose text has not come out yet

    def emit(text: str, source: str) -> None:
        if spans and spans[-1].source == source:
            spans[-1].text += text
            spans[-1].num_tokens += waiting
        else:
            spans.append(Span(text, source, waiting))

    for token, source in zip(tokens, sources):
        waiting += 1
        text = detokenizer.add([token])
        if text:
            emit(text, source)
            waiting = 0
    if waiting:
        emit(detokenizer.flush(), sources[-1])
    return spans
