"""What drafting learns across requests of one process (:class:`DraftingState`): acceptance rates, the global
index of earlier requests, the measured verify and drafter costs, and whether the drafter pays this round."""

from __future__ import annotations

import weakref
from collections.abc import Sequence

import torch

from .acceptance import AcceptanceEstimator
from .config import DraftingConfig
from .cost import VerifyCostModel, interpolate, keep_monotone
from .ngram_index import NGramIndex
from .policy import GoodputVerifyLength


class DraftingState:
    """What drafting learns across requests of one process: acceptance rates and the global index.

    Pass one instance to several ``generate`` calls (the default is one per target model, see
    :func:`default_drafting_state`); use separate instances to keep runs independent (e.g. in a benchmark).
    """

    EXPLORE_EVERY = 8  # rounds after which the drafter runs even when it does not seem to pay
    SCORE_COST = 0.1  # a drafter pass at most this share of a plain step runs every round to score look-ups

    def __init__(self, config: DraftingConfig | None = None):
        self.config = config or DraftingConfig()
        self.estimator = AcceptanceEstimator()
        self.forget_requests()  # the global index starts empty
        self.cost_model = VerifyCostModel()  # seconds per target forward by new tokens, measured as rounds run
        self.policy = GoodputVerifyLength(cost_model=self.cost_model)
        self.drafter_value: float | None = None  # moving average of drafts a drafter block got accepted
        self.drafter_seconds: dict[int, float] = {}  # rows -> moving average of one drafter pass over that many rows
        # proposed? -> rows -> moving average of a round's seconds outside its verify forward and drafter pass
        self.round_extra_seconds: dict[bool, dict[int, float]] = {True: {}, False: {}}
        self.rounds_since_drafter = 0
        self.seeded = False  # whether a drafter's acceptance prior was added (once per state)

    def seed_acceptance(self, prior: dict | None) -> None:
        """Start the acceptance rates from a drafter's shipped prior (once; a state already seeded keeps its rates)."""
        if prior is not None and not self.seeded:
            self.estimator.seed(prior)
            self.seeded = True

    def observe_round(
        self, num_tokens: int, verify_seconds: float, drafter_seconds: float | None, rows: int = 1, ragged: bool = False
    ) -> None:
        """Feed one round's measured costs: the verification forward (``rows`` rows, ``num_tokens`` in all,
        ``ragged`` when rows of different lengths were packed) and, if it ran, the drafter."""
        self.cost_model.update(num_tokens, verify_seconds, rows, ragged=ragged)
        if drafter_seconds is not None:
            self.rounds_since_drafter = 0
            old = self.drafter_seconds.get(rows)
            self.drafter_seconds[rows] = drafter_seconds if old is None else 0.8 * old + 0.2 * drafter_seconds
            keep_monotone(self.drafter_seconds, rows)

    def observe_extra(self, rows: int, proposed: bool, seconds: float) -> None:
        """Feed one round's seconds outside its verify forward and drafter pass (look-ups, the draft tree, accepting,
        bookkeeping), for a round that ``proposed`` or a plain step of ``rows`` rows."""
        table = self.round_extra_seconds[proposed]
        old = table.get(rows)
        table[rows] = max(0.0, seconds) if old is None else 0.8 * old + 0.2 * max(0.0, seconds)
        keep_monotone(table, rows)

    def proposal_overhead(self, rows: int) -> float | None:
        """Estimated seconds a proposing round of ``rows`` rows spends beyond a plain step's, outside the verify
        forward and the drafter's pass: the look-ups, the draft tree and their bookkeeping, which grow with the
        rows and the candidates; None until both kinds of round were measured.

        The verify cost model prices only the forward, so without this a batched round looks cheaper against a
        plain step than it is (the row slowdown bound, :func:`~.goodput.within_slowdown`, adds it)."""
        spec, plain = self.round_extra_seconds[True], self.round_extra_seconds[False]
        if not spec or not plain:
            return None
        return max(0.0, interpolate(spec, rows) - interpolate(plain, rows))

    def drafter_cost(self, rows: int) -> float | None:
        """Estimated seconds of one drafter pass over ``rows`` rows: measured where that many rows drafted,
        else interpolated between (or extrapolated from) the row counts measured; None before any pass.

        A pass over 16 rows drafts 16 blocks and costs several times a one-row pass, so one average over the
        batch sizes a server runs would call the drafter cheap at high load and dear at batch 1."""
        return interpolate(self.drafter_seconds, rows) if self.drafter_seconds else None

    def drafter_pays(self, best_other: Sequence[float], width: int) -> bool:
        """Whether running the drafter this round is expected to pay for itself.

        The drafter can add ``max(0, D - E_row)`` accepted tokens per row, where D is what its blocks
        have recently been getting accepted and E_row the best other candidate; it pays when that
        relative gain in tokens beats its relative cost against a verification forward of ``width`` tokens per
        row for every row (both measured on this machine).
        """
        self.rounds_since_drafter += 1
        seconds = self.drafter_cost(len(best_other))
        if self.drafter_value is None or seconds is None or not self.cost_model.measured:
            return True  # nothing measured yet: try it
        if self.rounds_since_drafter >= self.EXPLORE_EVERY:
            return True  # keep its estimate fresh even while skipped (a drafter that adapts online improves)
        gain = sum(max(0.0, self.drafter_value - e) for e in best_other)
        tokens = sum(1 + e for e in best_other)
        return gain / tokens > seconds / self.cost_model.cost_batch(len(best_other), width)

    def drafter_is_cheap(self, rows: int) -> bool:
        """Whether a drafter pass costs at most ``SCORE_COST`` of a plain step of ``rows`` rows (both measured),
        so running it every round to score the look-up candidates (``DraftingConfig.drafter_scores``) is worth it."""
        seconds = self.drafter_cost(rows)
        if seconds is None or not self.cost_model.measured:
            return False
        return seconds <= self.SCORE_COST * self.cost_model.cost_batch(rows, 1)

    def remember(self, tokens: Sequence[int]) -> None:
        """Add a finished request (prompt and output) to the global index."""
        self.global_index.start_stream(tokens)

    def forget_requests(self) -> None:
        """Empty the global index (earlier requests' text); measured costs and acceptance rates stay."""
        self.global_index = NGramIndex(self.config.max_ngram, max_tokens=self.config.global_max_tokens)


_DEFAULT_STATES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def default_drafting_state(target: torch.nn.Module) -> DraftingState:
    """The :class:`DraftingState` that generation calls on ``target`` share unless given their own."""
    if target not in _DEFAULT_STATES:
        _DEFAULT_STATES[target] = DraftingState()
    return _DEFAULT_STATES[target]
