"""SpeculativeBatch: rows join and leave between rounds, and every row still gets the target's own output."""

from __future__ import annotations

import pytest
import torch

from adaflash_hf import DraftingConfig, DraftingState, FixedVerifyLength
from adaflash_hf.decoding.kv_cache import packed_index, relayout_cache
from adaflash_hf.decoding.sampling import SamplingParams
from adaflash_hf.decoding.state import RowSpec, SpeculativeBatch

from conftest import EOS, greedy_reference, random_prompts


def run_staggered(batch: SpeculativeBatch, specs: list[RowSpec], join_every: int, cancel: set | None = None) -> dict:
    """Add one spec every ``join_every`` rounds; drop ``cancel`` ids after their 3rd round; collect tokens."""
    tokens: dict = {s.row_id: [] for s in specs}
    finished: dict = {}
    pending, rounds = list(specs), 0
    while pending or len(batch):
        if pending and rounds % join_every == 0:
            updates = batch.add_rows([pending.pop(0)])
        else:
            updates = batch.step()
        rounds += 1
        for u in updates:
            tokens[u.row_id].extend(u.tokens)
            if u.finish_reason:
                finished[u.row_id] = u.finish_reason
        for row in cancel or ():
            if row in batch.ids and len(tokens[row]) >= 3:
                batch.drop_rows([row])
                finished[row] = "cancelled"
    return {"tokens": tokens, "finished": finished}


@pytest.mark.parametrize("compact_min_slots", [1, 10_000])
@pytest.mark.parametrize("sources", ["drafter", "all"])
def test_rows_joining_mid_generation_match_the_target(target, drafter, sources, compact_min_slots):
    prompts = random_prompts([5, 11, 3, 8, 14], seed=3)
    budgets = [20, 9, 25, 16, 12]
    drafting = DraftingConfig.only("drafter") if sources == "drafter" else DraftingConfig()
    state = DraftingState(drafting)
    state.EXPLORE_EVERY = 1  # run the drafter every round, so joins meet a drafter cache that keeps growing
    batch = SpeculativeBatch(
        target,
        drafter,
        drafting=drafting,
        drafting_state=state,
        verify_policy=FixedVerifyLength(),
        compact_min_slots=compact_min_slots,
    )
    specs = [RowSpec(i, p, n, stop_ids=frozenset({EOS})) for i, (p, n) in enumerate(zip(prompts, budgets))]
    result = run_staggered(batch, specs, join_every=2)
    for i, (prompt, n) in enumerate(zip(prompts, budgets)):
        reference = greedy_reference(target, prompt, n)[len(prompt) :]
        assert result["tokens"][i] == reference, f"row {i}"
        assert result["finished"][i] == ("stop" if reference[-1] == EOS else "length")
    assert len(batch) == 0


def test_cancelled_rows_leave_and_the_others_are_unchanged(target, drafter):
    prompts = random_prompts([6, 9, 4, 7], seed=5)
    batch = SpeculativeBatch(target, drafter, drafting_state=DraftingState(), compact_min_slots=1)
    specs = [RowSpec(f"r{i}", p, 18) for i, p in enumerate(prompts)]
    result = run_staggered(batch, specs, join_every=1, cancel={"r1", "r2"})
    assert result["finished"]["r1"] == result["finished"]["r2"] == "cancelled"
    for i in (0, 3):
        reference = greedy_reference(target, prompts[i], 18, eos=False)[len(prompts[i]) :]
        assert result["tokens"][f"r{i}"] == reference


def test_greedy_rows_stay_exact_next_to_sampled_rows(target, drafter):
    prompts = random_prompts([5, 7], seed=9)
    batch = SpeculativeBatch(
        target, drafter, drafting_state=DraftingState(), generator=torch.Generator().manual_seed(0)
    )
    updates = batch.add_rows(
        [
            RowSpec("greedy", prompts[0], 15),
            RowSpec("sampled", prompts[1], 15, SamplingParams(do_sample=True, temperature=1.5)),
        ]
    )
    tokens = {"greedy": [], "sampled": []}
    while True:
        for u in updates:
            tokens[u.row_id].extend(u.tokens)
        if not len(batch):
            break
        updates = batch.step()
    assert tokens["greedy"] == greedy_reference(target, prompts[0], 15, eos=False)[len(prompts[0]) :]
    assert len(tokens["sampled"]) == 15


def test_add_rows_rejects_duplicate_ids_and_empty_prompts(target, drafter):
    batch = SpeculativeBatch(target, drafter, drafting_state=DraftingState())
    batch.add_rows([RowSpec("a", [5, 6], 10)])
    with pytest.raises(ValueError, match="already in the batch"):
        batch.add_rows([RowSpec("a", [5, 6], 10)])
    with pytest.raises(ValueError, match="non-empty prompt"):
        batch.add_rows([RowSpec("b", [], 10)])


def test_relayout_and_packing_move_slots_exactly():
    mask = torch.tensor([[0, 1, 0, 1], [1, 1, 1, 0]])
    index = packed_index(mask)
    assert index.tolist() == [[-1, 1, 3], [0, 1, 2]]

    class Layer:
        keys = torch.arange(2 * 4, dtype=torch.float).view(2, 1, 4, 1)
        values = keys.clone()

    class Cache:
        layers = [Layer()]

    relayout_cache(Cache, index)
    assert Cache.layers[0].keys.flatten().tolist() == [0, 1, 3, 4, 5, 6]  # row 0's hole becomes a zero slot


def test_a_join_after_the_drafter_cache_compacts_to_nothing(target, drafter):
    """Row b joins after a's drafter context; a leaves; b's drafter-cached slots are all holes and compact to
    width 0; c must still join both caches (a regression: the empty drafter cache lost track of its rows)."""
    state = DraftingState(DraftingConfig.only("drafter"))
    state.EXPLORE_EVERY = 1
    batch = SpeculativeBatch(target, drafter, drafting=state.config, drafting_state=state, compact_min_slots=1)
    prompts = random_prompts([3, 12, 5], seed=21)
    tokens = {"a": [], "b": [], "c": []}

    def take(updates):
        for u in updates:
            tokens[u.row_id].extend(u.tokens)

    take(batch.add_rows([RowSpec("a", prompts[0], 30)]))
    take(batch.step())
    take(batch.add_rows([RowSpec("b", prompts[1], 12)]))
    batch.drop_rows(["a"])
    take(batch.add_rows([RowSpec("c", prompts[2], 12)]))
    while len(batch):
        take(batch.step())
    for name, prompt in (("b", prompts[1]), ("c", prompts[2])):
        assert tokens[name] == greedy_reference(target, prompt, 12, eos=False)[len(prompt) :]


def _drafter_blocks(batch: SpeculativeBatch) -> dict:
    """Record, per row, every block the drafter proposes (the proposer's call into the drafter)."""
    blocks: dict = {}
    propose = batch.drafter_proposer.propose

    def recording(ids, *args, **kwargs):
        block = propose(ids, *args, **kwargs)
        for row, drafts in zip(ids, block.tokens.tolist()):
            blocks.setdefault(row, []).append(drafts)
        return block

    batch.drafter_proposer.propose = recording
    return blocks


@pytest.mark.parametrize("compact_min_slots", [1, 10_000])
def test_the_drafter_sees_the_same_context_alone_and_in_a_batch_with_joins(target, drafter, compact_min_slots):
    """The drafter's layout (its cache, mask and unread context) is kept apart from the target's: every row must
    get the same draft blocks whether it decodes alone or joins a batch whose other rows come and go."""
    prompts = random_prompts([5, 11, 3, 8], seed=13)
    budgets = [14, 9, 16, 12]

    def new_batch():
        state = DraftingState(DraftingConfig.only("drafter"))
        state.EXPLORE_EVERY = 1
        return SpeculativeBatch(
            target,
            drafter,
            drafting=state.config,
            drafting_state=state,
            verify_policy=FixedVerifyLength(),
            compact_min_slots=compact_min_slots,
        )

    alone = {}
    for i, (prompt, n) in enumerate(zip(prompts, budgets)):
        batch = new_batch()
        blocks = _drafter_blocks(batch)
        run_staggered(batch, [RowSpec(i, prompt, n)], join_every=1)
        alone[i] = blocks[i]
    batch = new_batch()
    together = _drafter_blocks(batch)
    run_staggered(batch, [RowSpec(i, p, n) for i, (p, n) in enumerate(zip(prompts, budgets))], join_every=3)
    for i in alone:
        assert together[i] == alone[i], f"row {i}"


def test_rounds_without_the_drafter_leave_the_target_cache_as_tight_as_plain_decoding(target, drafter):
    """After the drafter has run, held rounds (no drafts) only collect features for it: as rows join, the
    target cache keeps exactly the slots of a batch without a drafter (it used to grow by the drafter's part)."""
    prompts = random_prompts([4, 11, 13, 9], seed=17)
    slots = {}
    for name, d in (("drafter", drafter), ("plain", None)):
        state = DraftingState(
            DraftingConfig.only("drafter")
            if d is not None
            else DraftingConfig(drafter=False, global_index=False, datastore=False)
        )
        batch = SpeculativeBatch(
            target, d, drafting=state.config, drafting_state=state, verify_policy=FixedVerifyLength()
        )
        batch.add_rows([RowSpec("a", prompts[0], 40)])
        if d is not None:
            batch.step()  # one speculative round: the drafter caches row a's context
            assert batch.drafter_proposer.cache.get_seq_length() > 0
            slots["made"] = batch.num_new["a"]
        else:
            while batch.num_new["a"] < slots["made"]:
                batch.step()
        batch.policy = FixedVerifyLength(1)  # from here on: plain steps
        seen = []
        for i, prompt in enumerate(prompts[1:]):
            batch.add_rows([RowSpec(i, prompt, 20)])
            for _ in range(2):
                batch.step()
                seen.append(batch.num_slots)
        slots[name] = seen
    assert slots["drafter"] == slots["plain"]


def test_the_round_that_ends_a_hold_reports_its_time_less_the_drafters_catching_up(target, drafter, monkeypatch):
    """Rounds that skip the drafter leave their features unread; the round that resumes drafting reads them all. The
    policy is told that round's time less the catching-up share of the drafter pass (by tokens), so a long hold does
    not make speculation look dearer than a drafter running every round would."""
    from adaflash_hf.decoding import learning, membership
    from adaflash_hf.decoding import state as state_module
    from adaflash_hf.decoding.proposers import drafter as drafter_module
    from adaflash_hf.decoding.proposers.drafter import catch_up_seconds

    assert catch_up_seconds(0.1, read=30, fresh=6, block=10) == pytest.approx(0.1 * 24 / 40)
    assert catch_up_seconds(0.1, read=4, fresh=6, block=10) == 0.0  # nothing beyond one round's context

    class Hold:  # plain steps for 6 rounds, then drafts; records what each round reported
        def __init__(self):
            self.rounds, self.reported = 0, []

        def wants_drafts(self, rows):
            return self.rounds >= 6

        def verify_lens(self, rates, hidden, sources=None):
            return torch.full((rates.shape[0],), rates.shape[1] + 1, dtype=torch.long)

        def update(self, accept_lengths, verify_lens, seconds, proposed=None):
            self.rounds += 1
            self.reported.append((seconds, proposed))

    clock = [0.0]
    for module in (state_module, membership, drafter_module, learning):  # every clock the round reads
        monkeypatch.setattr(module, "timer", lambda device: clock[0])
    real_draft_block = drafter_module.draft_block
    read = []

    def slow_draft_block(drafter, embed, anchors, context, context_pos, anchor_pos, key_mask, cache):
        read.append(context.shape[1])
        clock[0] += 0.001 * (context.shape[1] + drafter.config.block_size)  # 1 ms per token the pass runs over
        return real_draft_block(drafter, embed, anchors, context, context_pos, anchor_pos, key_mask, cache)

    monkeypatch.setattr(drafter_module, "draft_block", slow_draft_block)
    from dataclasses import replace

    state = DraftingState(replace(DraftingConfig.only("drafter"), drafter_every_round=True))
    policy = Hold()
    batch = SpeculativeBatch(target, drafter, drafting=state.config, drafting_state=state, verify_policy=policy)
    batch.add_rows([RowSpec("a", random_prompts([9], seed=3)[0], 40)])
    for _ in range(8):
        batch.step()
    held, resumed, steady = policy.reported[5], policy.reported[6], policy.reported[7]
    assert held == (0.0, False) and resumed[1] and steady[1]
    assert read[0] == 9 + 6  # the prompt and six held rounds' tokens, read at once
    block = drafter.config.block_size
    assert resumed[0] == pytest.approx(
        0.001 * (read[0] + block) - 0.001 * (read[0] - 1)
    )  # only the last round's token counts
    assert steady[0] == pytest.approx(0.001 * (read[1] + block))  # a drafter running every round: nothing to subtract
