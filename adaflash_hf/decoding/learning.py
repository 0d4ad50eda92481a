"""Learning from a verified round, in one place: the measured verify and drafter costs, the acceptance
estimates of every candidate the round offered, and the verify-length policy's feedback."""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import torch

from .cost import timer
from .drafting_state import DraftingState
from .policy import VerifyLengthPolicy, report_round
from .proposers.base import Candidate, Proposal


@dataclass
class VerifiedRound:
    """What one round's verification did: accept_lengths (b,) accepted drafts per row, num_drafts (b,) drafts
    verified per row, num_tokens the tokens the forward carried (``ragged``: packed into one row), and its
    seconds."""

    accept_lengths: torch.Tensor
    num_drafts: torch.Tensor
    num_tokens: int
    ragged: bool
    seconds: float


def learn_from_round(
    state: DraftingState,
    policy: VerifyLengthPolicy,
    proposal: Proposal,
    verified: VerifiedRound,
    chunks: Sequence[Sequence[int]],
    proposed: bool,
    round_start: float,
    device: torch.device,
    row_ids: Sequence[Hashable] | None = None,
) -> None:
    """Feed the round to everything that learns from it; ``chunks[i]`` are the tokens row i gained (``row_ids[i]``
    is its id, for policies that follow rows).

    The policy is told the whole round's time since ``round_start``, less the drafter's catching up on context
    held back while it was skipped (:func:`~.proposers.drafter.catch_up_seconds`); the state, what the round spent
    outside its verify forward and drafter pass (:meth:`~.drafting_state.DraftingState.observe_extra`).
    """
    block = proposal.block
    rows = len(chunks)
    state.observe_round(
        verified.num_tokens,
        verified.seconds,
        None if block is None else block.seconds,
        rows=rows,
        ragged=verified.ragged,
    )
    learn_acceptance(state, proposal.candidates or [], chunks)
    seconds = timer(device) - round_start - (0.0 if block is None else block.catch_up)
    drafter_seconds = 0.0 if block is None else block.seconds - block.catch_up
    state.observe_extra(rows, proposed, seconds - verified.seconds - drafter_seconds)
    report_round(policy, verified.accept_lengths.cpu(), verified.num_drafts.cpu() + 1, seconds, proposed, row_ids)


def learn_acceptance(
    state: DraftingState, candidates: Sequence[Sequence[Candidate]], chunks: Sequence[Sequence[int]]
) -> None:
    """Teach the estimator from what the target produced, for every candidate of the round.

    ``chunks[i]`` are the tokens row i gained (accepted drafts plus the target's own token), i.e. the
    target's continuation. A candidate token would have been accepted exactly when it equals that
    continuation, so the candidates that were not chosen are scored too (counterfactually): every source
    keeps learning even while another one wins.
    """
    for options, chunk in zip(candidates, chunks):
        for source, tokens, features in options:
            agree = 0
            while agree < min(len(tokens), len(chunk)) and tokens[agree] == chunk[agree]:
                agree += 1
            state.estimator.update(source, features, min(len(tokens), len(chunk)), agree)
            if source == "drafter":
                old = state.drafter_value
                state.drafter_value = agree if old is None else old + 0.05 * (agree - old)
