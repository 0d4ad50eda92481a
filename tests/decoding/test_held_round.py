"""A held round (the policy keeps plain steps) is a plain batched step: one target forward of one token per row, no
drafter, no look-ups, no per-row bookkeeping of the drafter's context; drafting resumes with exactly the context
it would have read had it never been held, and outputs stay the target's own."""

from __future__ import annotations

import itertools

import pytest
import torch

from adaflash_hf import DraftingConfig, DraftingState, FixedVerifyLength, GoodputVerifyLength
from adaflash_hf.decoding import learning as learning_module
from adaflash_hf.decoding import membership as membership_module
from adaflash_hf.decoding import state as state_module
from adaflash_hf.decoding.ngram_index import NGramIndex
from adaflash_hf.decoding.proposers import drafter as drafter_module
from adaflash_hf.decoding.proposers.datastore import DatastoreProposer
from adaflash_hf.decoding.proposers.drafter import PendingContext
from adaflash_hf.decoding.proposers.global_index import GlobalIndexProposer
from adaflash_hf.decoding.proposers.hybrid import HybridProposer
from adaflash_hf.decoding.proposers.suffix import SuffixProposer
from adaflash_hf.decoding.state import RowSpec, SpeculativeBatch

from conftest import EOS, greedy_reference, random_prompts


class HeldGoodput(GoodputVerifyLength):
    """The adaptive default policy with its guard's answer forced to "hold plain steps"."""

    def wants_drafts(self, rows: int) -> bool:
        super().wants_drafts(rows)
        return False


class Alternating(FixedVerifyLength):
    """Whole proposals in the rounds ``drafting(round)`` allows, plain steps in the others."""

    def __init__(self, drafting):
        super().__init__(None)
        self.drafting, self.round = drafting, 0

    def wants_drafts(self, rows: int) -> bool:
        self.round += 1
        return self.drafting(self.round)


def test_a_held_round_does_one_forward_of_one_token_per_row_and_nothing_else(target, drafter, monkeypatch):
    prompts = random_prompts((6, 9, 4, 11), seed=5)
    state = DraftingState()
    state.remember(greedy_reference(target, prompts[0], 12, eos=False))  # the global index has something to offer
    drafter.adaflash_datastore = NGramIndex(4)
    drafter.adaflash_datastore.start_stream(prompts[1] + prompts[2])
    batch = SpeculativeBatch(target, drafter, drafting_state=state, verify_policy=HeldGoodput())
    assert len(batch.proposer.lookups) == 3  # suffix, global index and datastore are all there to skip
    batch.add_rows([RowSpec(i, p, 40) for i, p in enumerate(prompts)])

    counts: dict[str, int] = {}
    forwards: list[tuple[tuple[int, ...], object]] = []

    def counted(owner, name):
        original = getattr(owner, name)

        def wrapper(*args, **kwargs):
            counts[name] = counts.get(name, 0) + 1
            return original(*args, **kwargs)

        monkeypatch.setattr(owner, name, wrapper)

    for owner in (SuffixProposer, GlobalIndexProposer, DatastoreProposer):
        counted(owner, "candidates")
    counted(HybridProposer, "propose")
    counted(PendingContext, "add")  # per-row work on the drafter's unread context
    counted(drafter_module, "draft_block")
    drafter_forward, target_forward = drafter.forward, target.forward
    drafter.forward = lambda *a, **k: counts.update(drafter=counts.get("drafter", 0) + 1) or drafter_forward(*a, **k)
    target.forward = lambda *a, **k: (
        forwards.append((tuple(k["input_ids"].shape), k.get("output_hidden_states"))) or (target_forward(*a, **k))
    )
    try:
        rounds = 5
        for _ in range(rounds):
            updates = batch.step()
            assert [len(u.tokens) for u in updates] == [1] * len(prompts) and {u.source for u in updates} == {"none"}
    finally:
        del drafter.forward, target.forward
    assert counts == {}  # no look-up, no proposal, no drafter pass, no per-row context bookkeeping
    # one forward of one token per row; the hidden states requested are only the layers the drafter reads
    assert forwards == [((len(prompts), 1), batch.hidden_request)] * rounds
    assert batch.hidden_request == [i + 1 for i in drafter.config.target_layer_ids]
    # the held tokens' features wait, batch-wide, for the drafter's next pass
    assert len(batch.drafter_proposer.pending._held) == rounds


def drafter_contexts(target, drafter, prompts, budgets, drafting, eager: bool, monkeypatch) -> tuple[dict, list]:
    """Decode with rows joining every other round under ``Alternating(drafting)``; -> (tokens by row, the context
    every drafter pass read). ``eager``: the held rounds' features go to every row at once (the per-row commit)."""
    if eager:
        monkeypatch.setattr(
            PendingContext,
            "add_batch",
            lambda self, rows, hidden, pos: [
                self.add(row, hidden[i : i + 1], pos[i : i + 1]) for i, row in enumerate(rows)
            ],
        )
    # A clock that ticks once per reading: the choices that weigh measured seconds (which source pays, when the
    # drafter runs) are then the same in both runs, so any difference in what the drafter read is the commit's.
    ticks = itertools.count()
    for module in (state_module, learning_module, drafter_module, membership_module):
        monkeypatch.setattr(module, "timer", lambda device: next(ticks) * 1e-3)
    read = []
    real = drafter_module.draft_block

    def recording(drafter_, embed, anchors, context, context_pos, anchor_pos, key_mask, cache):
        read.append((context.clone(), context_pos.clone(), key_mask.clone()))
        return real(drafter_, embed, anchors, context, context_pos, anchor_pos, key_mask, cache)

    monkeypatch.setattr(drafter_module, "draft_block", recording)
    config = DraftingConfig(drafter_every_round=True)
    batch = SpeculativeBatch(
        target, drafter, drafting=config, drafting_state=DraftingState(config), verify_policy=Alternating(drafting)
    )
    tokens: dict = {i: [] for i in range(len(prompts))}
    pending, rounds = [RowSpec(i, p, n, stop_ids=frozenset({EOS})) for i, (p, n) in enumerate(zip(prompts, budgets))], 0
    while pending or len(batch):
        updates = batch.add_rows([pending.pop(0)]) if pending and rounds % 2 == 0 else batch.step()
        rounds += 1
        for update in updates:
            tokens[update.row_id].extend(update.tokens)
    monkeypatch.undo()
    return tokens, read


@pytest.mark.parametrize("pattern", ["alternate", "bursts"])
def test_drafting_resumes_with_the_context_it_would_have_read_and_outputs_stay_the_targets(
    target, drafter, pattern, monkeypatch
):
    drafting = {"alternate": lambda r: r % 2 == 0, "bursts": lambda r: r % 7 in (0, 1)}[pattern]
    prompts = random_prompts((5, 11, 3, 8), seed=7)
    budgets = [24, 13, 30, 18]
    tokens, read = drafter_contexts(target, drafter, prompts, budgets, drafting, False, monkeypatch)
    eager_tokens, eager_read = drafter_contexts(target, drafter, prompts, budgets, drafting, True, monkeypatch)
    for i, (prompt, n) in enumerate(zip(prompts, budgets)):
        assert tokens[i] == greedy_reference(target, prompt, n)[len(prompt) :], f"row {i}"
    assert eager_tokens == tokens and len(read) == len(eager_read) > 2
    for (context, pos, mask), (eager_context, eager_pos, eager_mask) in zip(read, eager_read):
        assert torch.equal(pos, eager_pos) and torch.equal(mask, eager_mask)
        # the same features in the same slots (two runs of the same engine differ by fp32 rounding, ~1e-6)
        torch.testing.assert_close(context, eager_context, rtol=0, atol=1e-5)


def test_pending_context_keeps_order_across_batch_chunks_and_reads_only_the_newest_max_width():
    pending = PendingContext(max_width=4)
    features = torch.arange(40.0).view(20, 2)  # token t's feature is [2t, 2t + 1]
    pending.add("a", features[0:2], torch.arange(0, 2))
    pending.add("b", features[10:11], torch.arange(10, 11))
    for t in range(2, 5):  # held rounds: one batch-wide chunk each
        pending.add_batch(["a", "b"], features[[t, t + 9]], torch.tensor([t, t + 9]))
    pending.add("a", features[5:7], torch.arange(5, 7))  # a round that accepted more: per row, after the held ones
    hidden, pos, mask = pending.take(["a", "b"], 2, features)
    assert pos.tolist() == [[3, 4, 5, 6], [10, 11, 12, 13]] and mask.tolist() == [[1] * 4] * 2
    assert torch.equal(hidden[0], features[3:7]) and torch.equal(hidden[1], features[10:14])
    for t in range(7, 20):  # a long hold keeps at most twice max_width per row and reads the newest max_width
        pending.add_batch(["a"], features[t : t + 1], torch.tensor([t]))
        pending.add("b", features[t : t + 1], torch.arange(t, t + 1))
    assert max(pending.widths.values()) <= 2 * pending.max_width
    hidden, pos, _ = pending.take(["a", "b"], 2, features)
    assert pos.tolist() == [list(range(16, 20))] * 2 and torch.equal(hidden[0], features[16:20])


class AlternatingGoodput(GoodputVerifyLength):
    """The adaptive default policy, proposing in every other round and holding plain steps in the rest."""

    rounds = 0

    def wants_drafts(self, rows: int) -> bool:
        super().wants_drafts(rows)
        self.rounds += 1
        return self.rounds % 2 == 1


def test_what_a_proposing_round_spends_beyond_a_plain_step_is_measured_for_the_slowdown_bound(
    target, drafter, monkeypatch
):
    """Look-ups and the draft tree cost time the verify cost model does not price; the engine measures a proposing
    round's time outside its forward and drafter pass against a plain step's and binds the estimate to the policy."""
    import time

    slow = 0.05
    original = SuffixProposer.candidates

    def slow_candidates(self, *args, **kwargs):
        time.sleep(slow / 4)  # per row: four rows spend ``slow`` seconds a proposing round
        return original(self, *args, **kwargs)

    monkeypatch.setattr(SuffixProposer, "candidates", slow_candidates)
    prompts = random_prompts((6, 9, 4, 11), seed=7)
    state = DraftingState()
    policy = AlternatingGoodput()
    batch = SpeculativeBatch(target, drafter, drafting_state=state, verify_policy=policy)
    assert policy.proposal_overhead == state.proposal_overhead  # bound by the engine, like the drafter's cost
    assert state.proposal_overhead(4) is None  # nothing measured yet
    tokens: dict = {i: [] for i in range(len(prompts))}
    updates = batch.add_rows([RowSpec(i, p, 12, stop_ids=frozenset()) for i, p in enumerate(prompts)])
    while updates or len(batch):
        for update in updates:
            tokens[update.row_id].extend(update.tokens)
        updates = batch.step() if len(batch) else []
    for i, prompt in enumerate(prompts):  # outputs stay the target's own
        assert tokens[i] == greedy_reference(target, prompt, 12, eos=False)[len(prompt) :]
    measured = {proposed: set(table) for proposed, table in state.round_extra_seconds.items()}
    assert all(measured.values()), measured  # both kinds of round were measured
    assert state.proposal_overhead(4) >= 0.5 * slow  # the slow look-ups show, the verify forward does not
