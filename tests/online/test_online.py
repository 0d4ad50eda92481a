"""On-line distillation: the top-k OPD loss, trajectory recording, the buffer, adapter swaps and faults."""

from __future__ import annotations

import copy
import threading
import time

import pytest
import torch

from adaflash_hf import AdaFlashDrafter, enable_adaflash, heap
from adaflash_hf.decoding.datastore_file import load_datastore, save_datastore
from adaflash_hf.decoding.engine import generate
from adaflash_hf.decoding.policy import FixedVerifyLength
from adaflash_hf.decoding.proposers.drafter import context_features
from adaflash_hf.online import (
    AdaFlashOPD,
    AdapterFollower,
    AdapterSlot,
    LoraSettings,
    OPDConfig,
    Trajectory,
    TrajectoryBuffer,
    TrajectoryRecorder,
    attach_lora,
    datastore_sequences,
    load_retention_samples,
    merge_adapter,
    publish_adapter,
    retention_samples,
    save_retention_samples,
    teacher_forced_trajectory,
)
from adaflash_hf.online import distiller as distiller_module
from adaflash_hf.online.adapters import AdapterError, adapter_state, load_adapter_state
from adaflash_hf.online.soak import rss_mb
from adaflash_hf.training.length_head_records import AlwaysDraftState
from adaflash_hf.training.losses import clipped_reverse_kl, opd_topk_loss, topk_reverse_kl

from conftest import greedy_reference, left_pad, random_prompts, tiny_target


@pytest.fixture
def pair():
    target = tiny_target("llama").float()
    torch.manual_seed(1)
    return target, AdaFlashDrafter.from_target(target, num_layers=2, block_size=5).eval()


def _randomise_lora(model: torch.nn.Module, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.3)


# ------------------------------------------------------------------------------------------------
# the loss
def test_topk_reverse_kl_is_exact_with_every_token_and_a_lower_bound_with_fewer():
    torch.manual_seed(0)
    draft, target = torch.randn(6, 30), torch.randn(6, 30)
    logprobs = torch.log_softmax(target, -1)
    values, ids = logprobs.topk(30, -1)
    full = clipped_reverse_kl(draft, target, clip=1e9)
    torch.testing.assert_close(topk_reverse_kl(draft, ids, values, clip=1e9), full, atol=1e-5, rtol=1e-5)
    values, ids = logprobs.topk(4, -1)
    assert bool((topk_reverse_kl(draft, ids, values, clip=1e9) <= full + 1e-6).all())
    assert bool((topk_reverse_kl(draft, ids, values, clip=1e9) > 0).all())


def test_topk_reverse_kl_is_zero_when_the_draft_equals_the_target():
    logits = torch.randn(5, 20)
    values, ids = torch.log_softmax(logits, -1).topk(6, -1)
    torch.testing.assert_close(topk_reverse_kl(logits, ids, values, clip=1.0), torch.zeros(5), atol=1e-5, rtol=0)


def test_a_clipped_entry_gets_zero_gradient():
    torch.manual_seed(0)
    target = torch.randn(2, 20)
    values, ids = torch.log_softmax(target, -1).topk(8, -1)
    draft = torch.stack([target[0] + 0.01 * torch.randn(20), -3 * target[1]]).requires_grad_()  # small KL, large KL
    kl = topk_reverse_kl(draft, ids, values, clip=0.05)
    assert kl[0] < 0.05 and kl[1] == 0.05
    kl.sum().backward()
    assert draft.grad[1].abs().max() == 0 and draft.grad[0].abs().max() > 0


def test_opd_topk_loss_mixes_ce_and_kl_and_skips_labels_outside_the_draft_vocab():
    torch.manual_seed(0)
    draft, target = torch.randn(4, 12), torch.randn(4, 12)
    values, ids = torch.log_softmax(target, -1).topk(12, -1)
    w = torch.ones(4)
    ce = torch.nn.functional.cross_entropy(draft, ids[:, 0])
    torch.testing.assert_close(opd_topk_loss(draft, ids, values, w, alpha=1.0), ce)
    kl = clipped_reverse_kl(draft, target, clip=0.5).mean()
    torch.testing.assert_close(opd_topk_loss(draft, ids, values, w, alpha=0.0, clip=0.5), kl, atol=1e-5, rtol=1e-5)
    outside = ids.clone()
    outside[0, 0] = -100  # the target's argmax of row 0 is not in the draft vocabulary: no CE there
    ce_rest = torch.nn.functional.cross_entropy(draft[1:], ids[1:, 0], reduction="sum") / 4
    torch.testing.assert_close(opd_topk_loss(draft, outside, values, w, alpha=1.0), ce_rest)
    with pytest.raises(ValueError, match="alpha"):
        opd_topk_loss(draft, ids, values, w, alpha=1.5)


# ------------------------------------------------------------------------------------------------
# recording and the buffer
def _trajectory(n: int, features: int = 8) -> Trajectory:
    return Trajectory(
        torch.arange(n, dtype=torch.int32),
        2,
        torch.zeros(n - 1, features, dtype=torch.bfloat16),
        torch.zeros(n - 2, 4, dtype=torch.int32),
        torch.zeros(n - 2, 4),
        torch.zeros(n, dtype=torch.bool),
    )


def test_buffer_is_bounded_in_count_and_bytes_and_drops_the_oldest():
    buffer = TrajectoryBuffer(max_trajectories=3, max_bytes=10**9)
    for n in range(4, 9):
        buffer.add(_trajectory(n))
    assert len(buffer) == 3 and buffer.dropped == 2
    assert [len(t.tokens) for t in buffer.take(10)] == [6, 7, 8]
    one = _trajectory(20).nbytes
    buffer = TrajectoryBuffer(max_trajectories=100, max_bytes=int(2.5 * one))
    for _ in range(5):
        buffer.add(_trajectory(20))
    assert len(buffer) == 2 and buffer.nbytes <= 2.5 * one and buffer.dropped == 3
    with pytest.raises(ValueError, match="room"):
        TrajectoryBuffer(max_trajectories=0)


def test_buffer_is_thread_safe():
    buffer = TrajectoryBuffer(max_trajectories=50, max_bytes=10**9)
    taken = []

    def produce():
        for _ in range(200):
            buffer.add(_trajectory(6))

    def consume():
        for _ in range(300):
            taken.extend(buffer.take(3))

    threads = [threading.Thread(target=produce) for _ in range(4)] + [
        threading.Thread(target=consume) for _ in range(2)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    counters = buffer.counters()
    assert counters["added"] == 800
    assert counters["taken"] == len(taken)
    assert counters["added"] == counters["taken"] + counters["dropped"] + counters["size"]
    assert counters["bytes"] == sum(t.nbytes for t in buffer.take(1000))


def test_recorded_trajectories_match_a_fresh_target_pass(pair):
    """Recording costs no extra pass, and what it keeps is what a teacher-forced pass would compute."""
    target, drafter = pair
    buffer = TrajectoryBuffer()
    recorder = TrajectoryRecorder(buffer, top_k=5)
    ids, mask = left_pad(random_prompts([5, 9, 7]))
    out = generate(target, drafter, ids, mask, max_new_tokens=20, do_sample=False, observer=recorder)
    trajectories = buffer.take(10)
    assert len(trajectories) == 3 and recorder.open_rows == 0
    prompts = [ids[row][mask[row].bool()].tolist() for row in range(3)]
    for t in trajectories:  # they arrive in the order rows finish
        row = prompts.index(t.tokens[: t.prompt_len].tolist())
        prompt = ids[row][mask[row].bool()]
        new = out.sequences[row, ids.shape[1] :][: out.num_new_tokens[row]]
        assert t.tokens.tolist() == prompt.tolist() + new.tolist()
        assert len(t.features) == len(t.tokens) - 1 and len(t.teacher_ids) == t.num_generated
        ref = target(t.tokens[None, :-1].long(), output_hidden_states=True)
        torch.testing.assert_close(
            t.features.float(),
            context_features(ref.hidden_states, drafter.config.target_layer_ids)[0],
            atol=3e-2,
            rtol=3e-2,
        )  # stored as bf16
        assert torch.equal(
            t.teacher_ids[:, 0].long(), ref.logits[0, t.prompt_len - 1 :].argmax(-1)
        )  # greedy: the tokens
        assert torch.equal(t.teacher_ids[:, 0].long(), t.tokens[t.prompt_len :].long())
        torch.testing.assert_close(
            t.teacher_logprobs,
            torch.log_softmax(ref.logits[0, t.prompt_len - 1 :], -1).topk(5, -1).values,
            atol=1e-4,
            rtol=1e-4,
        )
        assert sum(t.source_tokens.values()) == t.num_generated


def test_a_teacher_forced_trajectory_is_what_the_recorder_keeps_for_the_same_tokens(pair):
    """Retention trajectories are built from text with one target pass: they must equal recorded ones."""
    target, drafter = pair
    buffer = TrajectoryBuffer()
    ids = torch.tensor([random_prompts([6], seed=2)[0]])
    generate(
        target,
        drafter,
        ids,
        torch.ones_like(ids),
        max_new_tokens=16,
        do_sample=False,
        observer=TrajectoryRecorder(buffer, top_k=5),
    )
    (recorded,) = buffer.take(1)
    built = teacher_forced_trajectory(
        target, drafter.config.target_layer_ids, recorded.tokens.tolist(), recorded.prompt_len, top_k=5
    )
    assert torch.equal(built.tokens, recorded.tokens) and built.prompt_len == recorded.prompt_len
    torch.testing.assert_close(built.features.float(), recorded.features.float(), atol=3e-2, rtol=3e-2)
    assert torch.equal(built.teacher_ids, recorded.teacher_ids)
    torch.testing.assert_close(built.teacher_logprobs, recorded.teacher_logprobs, atol=1e-4, rtol=1e-4)
    assert not built.rejected.any()
    with pytest.raises(ValueError, match="prompt_len"):
        teacher_forced_trajectory(target, drafter.config.target_layer_ids, [1, 2], prompt_len=2)


def test_datastore_sequences_spread_over_the_datastore_and_skip_short_responses(pair, tmp_path):
    _, drafter = pair
    assert datastore_sequences(drafter, 4) == []  # no datastore attached
    streams = [list(range(i, i + 20 + i)) for i in range(8)] + [[1, 2, 3]]
    save_datastore(streams, tmp_path / "datastore.safetensors")
    drafter.adaflash_datastore = load_datastore(tmp_path / "datastore.safetensors")
    try:
        picked = datastore_sequences(drafter, 4, max_tokens=24, min_tokens=16)
    finally:
        del drafter.adaflash_datastore
    assert picked == [s[:24] for s in streams[0:8:2]]


def test_the_generate_path_records_too(pair):
    target, drafter = pair
    enable_adaflash(target)
    buffer = TrajectoryBuffer()
    target.adaflash_observer = TrajectoryRecorder(buffer, top_k=3)
    ids = torch.tensor([random_prompts([6])[0]])
    out = target.generate(ids, assistant_model=drafter, max_new_tokens=24, do_sample=False)
    del target.adaflash_observer
    (t,) = buffer.take(5)
    assert t.tokens.tolist() == out[0, : len(t.tokens)].tolist()  # all but the final round
    assert len(t.tokens) > ids.shape[1] + 1
    assert torch.equal(t.teacher_ids[:, 0].long(), t.tokens[t.prompt_len :].long())


# ------------------------------------------------------------------------------------------------
# adapters: swap atomicity, publish, follow, merge
def test_a_swap_happens_only_between_rounds_and_never_tears(pair):
    target, drafter = pair
    attach_lora(drafter, LoraSettings(rank=4))
    slot = AdapterSlot(drafter)
    versions = []
    for seed in range(6):
        _randomise_lora(drafter, seed)
        versions.append(adapter_state(drafter))
    slot.offer(1, versions[0])
    assert slot.apply_pending() and slot.version == 1
    seen = []

    def fingerprint(module, args, kwargs):
        seen.append(tuple(float(p.sum()) for n, p in module.named_parameters() if "lora_" in n))

    handle = drafter.register_forward_pre_hook(fingerprint, with_kwargs=True)
    stop = threading.Event()

    def offer_forever():
        i = 0
        while not stop.is_set():
            slot.offer(2 + i % 5, versions[1 + i % 5])
            i += 1

    class SwapBetweenRounds:
        def before_round(self):
            slot.apply_pending()

        def on_prefill(self, *a): ...
        def on_round(self, *a): ...
        def on_finish(self, row): ...

    thread = threading.Thread(target=offer_forever)
    thread.start()
    try:
        ids, mask = left_pad(random_prompts([5, 8]))
        # the drafter drafts every round: the default state skips it where it does not seem to pay, and the
        # default policy's guard may hold plain steps (no proposals at all) for a batch whose drafts lose
        out = generate(
            target,
            drafter,
            ids,
            mask,
            max_new_tokens=30,
            do_sample=False,
            observer=SwapBetweenRounds(),
            drafting_state=AlwaysDraftState(),
            verify_policy=FixedVerifyLength(),
        )
    finally:
        stop.set()
        thread.join()
        handle.remove()
    allowed = {tuple(float(v.sum()) for v in _ordered(state, drafter)) for state in versions}
    assert seen and set(seen) <= allowed  # every drafter forward saw exactly one whole version
    assert len(set(seen)) > 1 and slot.swaps > 1
    reference = generate(target, None, ids, mask, max_new_tokens=30, do_sample=False).sequences
    assert torch.equal(out.sequences, reference)  # lossless across swaps


def _ordered(state: dict, drafter) -> list[torch.Tensor]:
    names = [n for n, _ in drafter.named_parameters() if "lora_" in n]
    lookup = {k.removeprefix("base_model.model.").replace(".weight", ""): v for k, v in state.items()}
    return [lookup[n.replace(".default.weight", "")] for n in names]


def test_offer_rejects_nan_and_mismatched_adapters(pair):
    _, drafter = pair
    attach_lora(drafter, LoraSettings(rank=4))
    slot = AdapterSlot(drafter)
    state = adapter_state(drafter)
    bad = {k: v.clone() for k, v in state.items()}
    next(iter(bad.values())).fill_(float("nan"))
    with pytest.raises(AdapterError, match="NaN"):
        slot.offer(1, bad)
    with pytest.raises(AdapterError, match="keys"):
        slot.offer(1, dict(list(state.items())[1:]))
    assert not slot.apply_pending() and slot.version == 0
    with pytest.raises(ValueError, match="attach_lora"):
        AdapterSlot(AdaFlashDrafter(drafter.config))


def test_publish_follow_skips_a_corrupt_version_and_merge_matches(pair, tmp_path):
    target, base = pair
    serving = attach_lora(copy.deepcopy(base), LoraSettings(rank=4))
    slot = AdapterSlot(serving)
    _randomise_lora(serving, 1)
    good = adapter_state(serving)
    _randomise_lora(serving, 2)
    newer = adapter_state(serving)
    publish_adapter(tmp_path, 1, good, LoraSettings(rank=4), "base")
    publish_adapter(tmp_path, 2, newer, LoraSettings(rank=4), "base")
    (tmp_path / "v0002" / "adapter_model.safetensors").write_bytes(b"garbage")  # a corrupt publication
    assert (tmp_path / "LATEST").read_text().strip() == "2"
    follower = AdapterFollower(tmp_path, slot)
    assert follower.poll() and slot.apply_pending()
    assert slot.version == 1 and follower.errors and "corrupt" in follower.errors[0]
    with pytest.raises(AdapterError, match="corrupt"):
        load_adapter_state(tmp_path / "v0002")
    # merging v1 into the base drafter gives the serving drafter's outputs
    merged = merge_adapter(base, tmp_path / "v0001")
    x, ctx = torch.randn(1, 5, 64), torch.randn(1, 6, base.fc.in_features)
    pos = torch.arange(11)[None]
    with torch.no_grad():
        torch.testing.assert_close(
            merged(noise_embeds=x, context_hidden_states=ctx, position_ids=pos).last_hidden_state,
            serving(noise_embeds=x, context_hidden_states=ctx, position_ids=pos).last_hidden_state,
            atol=2e-4,
            rtol=1e-3,
        )
    assert isinstance(merged, AdaFlashDrafter)


# ------------------------------------------------------------------------------------------------
# the pipeline and its faults
def _opd(target, drafter, **overrides) -> AdaFlashOPD:
    config = dict(
        min_trajectories=2,
        batch_trajectories=2,
        passes=1,
        steps_per_version=1,
        check_every=2,
        duty_cycle=1.0,
        lr=1e-2,
        worker="thread",  # the background thread; the inline tests below ask for "inline"
        min_improvement=-1.0,
    )  # every checked version is published: these tests are about swaps and faults, not the check
    config.update(overrides)
    return AdaFlashOPD(target, drafter, OPDConfig(**config))


def _serve(target, drafter, opd, rounds: int, reference=None):
    ids, mask = left_pad(random_prompts([5, 7, 9, 6]))
    for _ in range(rounds):
        out = generate(target, drafter, ids, mask, max_new_tokens=24, do_sample=False, observer=opd.observer)
        if reference is not None:
            assert torch.equal(out.sequences, reference)


def _wait(condition, timeout=60.0):
    end = time.time() + timeout
    while time.time() < end and not condition():
        time.sleep(0.05)
    return condition()


def test_opd_trains_publishes_swaps_and_stays_lossless(pair, tmp_path):
    target, drafter = pair
    ids, mask = left_pad(random_prompts([5, 7, 9, 6]))
    reference = generate(target, None, ids, mask, max_new_tokens=24, do_sample=False).sequences
    opd = _opd(target, drafter, publish_dir=str(tmp_path)).start()
    try:
        for _ in range(20):
            _serve(target, drafter, opd, 1, reference)
            if opd.slot.version >= 2:
                break
            _wait(lambda: opd.buffer.counters()["size"] == 0, timeout=10)
    finally:
        opd.stop()
    status = opd.status()
    assert status["steps"] > 0 and status["published"] >= 1 and status["adapter_version"] >= 1, status
    assert (tmp_path / "LATEST").exists() and (
        tmp_path / f"v{status['published_version']:04d}" / "adapter_config.json"
    ).exists()
    assert status["tau_history"] and status["errors"] == []


def test_a_nan_gradient_rolls_back_and_training_goes_on(pair):
    target, drafter = pair
    opd = _opd(target, drafter, steps_per_version=1000)
    good = {k: v.clone() for k, v in opd.good_state.items()}
    opd.inject_fault("nan")
    opd.start()
    try:
        end = time.time() + 120
        while time.time() < end and not (opd.status()["nan_steps"] and opd.status()["steps"]):
            if opd.buffer.counters()["size"] < 2:  # keep the trainer fed until it has stepped past the fault
                _serve(target, drafter, opd, 1)
            time.sleep(0.05)
    finally:
        opd.stop()
    status = opd.status()
    assert status["nan_steps"] == 1 and status["steps"] >= 1, status
    assert any("non-finite" in e for e in status["errors"])
    assert all(torch.isfinite(p).all() for p in opd.train_model.parameters())
    assert all(torch.equal(good[k], v) for k, v in opd.good_state.items())  # nothing bad was published


def test_a_killed_worker_is_reported_and_restarted_while_serving_goes_on(pair):
    target, drafter = pair
    ids, mask = left_pad(random_prompts([5, 7, 9, 6]))
    reference = generate(target, None, ids, mask, max_new_tokens=24, do_sample=False).sequences
    opd = _opd(target, drafter, max_restarts=1).start()
    opd.inject_fault("kill")
    assert _wait(lambda: not opd.status()["worker_alive"], timeout=10)
    assert opd.status()["state"] == "dead" and "worker killed" in opd.status()["errors"]
    _serve(target, drafter, opd, 2, reference)  # serving is unaffected
    assert opd.check_health() and opd.status()["restarts"] == 1
    assert _wait(lambda: opd.status()["worker_alive"], timeout=5)
    opd.inject_fault("kill")
    assert _wait(lambda: not opd.status()["worker_alive"], timeout=10)
    assert not opd.check_health() and opd.status()["state"] == "failed"  # out of restarts: reported, not hidden
    _serve(target, drafter, opd, 1, reference)
    opd.stop()


def test_a_full_buffer_drops_the_oldest_and_serving_is_unaffected(pair):
    target, drafter = pair
    ids, mask = left_pad(random_prompts([5, 7, 9, 6]))
    reference = generate(target, None, ids, mask, max_new_tokens=24, do_sample=False).sequences
    opd = _opd(target, drafter, buffer_trajectories=3)  # not started: nothing drains the buffer
    _serve(target, drafter, opd, 3, reference)
    counters = opd.status()["buffer"]
    assert counters["size"] == 3 and counters["dropped"] == 9 and counters["added"] == 12


def test_an_idle_trainer_revisits_recent_trajectories_only_when_replay_is_on(pair):
    target, drafter = pair
    for replay in (64, 0):
        opd = _opd(target, drafter, replay_trajectories=replay, steps_per_version=1000)
        _serve(target, drafter, opd, 1)  # 4 trajectories (2 trained on, 2 held out for the check), then no traffic
        opd.start()
        try:
            if replay:
                assert _wait(lambda opd=opd: opd.status()["replayed_batches"] >= 3, timeout=60)
            else:
                assert _wait(
                    lambda opd=opd: (
                        opd.status()["trained_trajectories"] == 2 and opd.status()["state"] == "waiting for data"
                    )
                )
                time.sleep(1.0)
        finally:
            opd.stop()
        status = opd.status()
        assert status["trained_trajectories"] == 2 and status["buffer"]["taken"] == 4
        if replay:
            assert status["steps"] >= 2 + 3 and len(opd.replay) == 2
        else:
            assert status["replayed_batches"] == 0 and status["steps"] == 2 and not opd.replay


def test_retention_samples_round_trip_and_opd_checks_on_their_prompts(pair, tmp_path):
    target, drafter = pair
    samples = [(list(range(1, 1 + n)), p) for n, p in [(30, 5), (40, 9), (25, 3), (50, 12)]]
    path = tmp_path / "retention.safetensors"
    save_retention_samples(samples, path)
    assert load_retention_samples(path) == samples
    drafter.adaflash_retention_file = str(path)
    try:
        assert retention_samples(drafter, 2, max_response_tokens=10) == [
            (samples[0][0][:15], 5),
            (samples[2][0][:13], 3),
        ]
        opd = AdaFlashOPD(
            target, drafter, OPDConfig(retention_trajectories=2, rehearsal_trajectories=0, worker="inline")
        )
        assert [p for _, p in opd._retention_text] == [
            5,
            3,
        ]  # prompts kept: the check reads responses after their questions
        path.write_bytes(b"not a safetensors file")
        with pytest.raises(OSError, match="retention samples .* cannot be read"):
            retention_samples(drafter, 2)
    finally:
        del drafter.adaflash_retention_file


def test_prepare_drafter_picks_retention_samples_with_short_prompts_and_enough_response():
    from adaflash_hf.training.data import TrainingSequence
    from adaflash_hf.training.vocab import pick_retention_samples

    sequences = [TrainingSequence(torch.arange(100), start) for start in (10, 500, 95, 20, 30, 40)]
    picked = pick_retention_samples(
        sequences, count=2, max_prompt_tokens=384, max_response_tokens=50, min_response_tokens=16
    )
    assert picked == [
        (list(range(60)), 10),
        (list(range(80)), 30),
    ]  # 500 (prompt too long) and 95 (5-token response) left out


def test_a_version_that_costs_the_trained_domains_is_not_published(pair):
    """The retention check: a candidate must keep the base drafter's τ on text of its training domains."""
    target, drafter = pair
    text = [p + p for p in random_prompts([12, 10, 14], seed=5)]
    opd = AdaFlashOPD(
        target,
        drafter,
        OPDConfig(
            min_trajectories=2,
            batch_trajectories=2,
            passes=1,
            steps_per_version=1000,
            check_every=2,
            retention_trajectories=3,
            worker="inline",
        ),
        retention=text,
    )
    _serve(target, drafter, opd, 1)  # 4 trajectories: 2 trained on, 2 held out
    while opd.retention_base_tau is None:
        assert opd._work_once(wait=0.0) > 0
    assert len(opd.retention_set) == 3 and not opd.rehearsal_set and opd.status()["retention"]["base_tau"] >= 1.0
    opd._work_once(wait=0.0)  # a first batch, so that the check set is filled
    assert opd.check_set
    opd.retention_base_tau = 1e9  # as if the candidate had lost τ on the trained domains
    opd._check_and_publish()
    assert opd.version == 0 and opd.counters["retention_rejections"] == 1 and opd.last_check["passed"] is False
    assert opd.last_check["retention_tau"] < 1e9
    opd.retention_base_tau = 1.0  # no loss: published
    opd._check_and_publish()
    assert opd.version == 1 and opd.last_check["passed"] is True


def test_rehearsal_mixes_trained_domain_trajectories_into_every_batch(pair):
    target, drafter = pair
    text = [p + p for p in random_prompts([12, 10, 14, 11], seed=6)]
    opd = AdaFlashOPD(
        target,
        drafter,
        OPDConfig(
            min_trajectories=2,
            batch_trajectories=2,
            passes=1,
            steps_per_version=1000,
            check_every=2,
            retention_trajectories=1,
            rehearsal_trajectories=2,
            worker="inline",
        ),
        retention=text,
    )
    batches = []
    opd._guarded_step = lambda batch: batches.append([t.tag for t in batch])
    _serve(target, drafter, opd, 1)
    while opd.retention_base_tau is None:
        opd._work_once(wait=0.0)
    assert len(opd.retention_set) == 1 and len(opd.rehearsal_set) == 3
    opd._work_once(wait=0.0)
    assert batches == [["", "retention", "retention"]]  # one live (one of the two was held out) + two rehearsed


def test_the_trainer_hands_freed_heap_back_after_each_check(pair, monkeypatch):
    """Training steps free activations of ever-changing sizes; glibc keeps those pages unless trimmed (the
    soak's resident memory grew 1 GB in 1,000 requests before this)."""
    target, drafter = pair
    calls = []
    monkeypatch.setattr(distiller_module, "release_freed_heap", lambda: calls.append(1))
    opd = _opd(
        target, drafter, steps_per_version=2, worker="inline", retention_trajectories=0, rehearsal_trajectories=0
    )
    _serve(target, drafter, opd, 2)
    for _ in range(4):
        assert opd._work_once(wait=0.0) > 0
    assert opd.status()["steps"] == 4 and len(calls) == 2


@pytest.mark.skipif(heap._malloc_trim() is None, reason="needs glibc's malloc_trim")
def test_release_freed_heap_returns_freed_tensor_memory_to_the_os():
    heap.release_freed_heap()  # pages earlier tests freed would otherwise be reused here without raising RSS
    start = rss_mb()
    tensors = [torch.ones(16_384) for _ in range(4_000)]  # 64 KiB each: heap, not mmap; 250 MiB in all
    last = tensors[-1]  # alive on top of the heap, so glibc cannot shrink it by itself
    del tensors
    freed = rss_mb()
    heap.release_freed_heap()
    assert freed - start > 150 and rss_mb() - start < 50, (start, freed, rss_mb())
    del last


ONEDNN_SHAPES = """
import sys, torch
import adaflash_hf  # caps oneDNN's primitive cache unless the variable is set
layer = torch.nn.Linear(8, 8).to(torch.bfloat16)
for _ in range(2):  # 300 shapes, twice: a cache of 256 rebuilds every one, a cache of 1,024 none
    for rows in range(65, 365):  # torch leaves fewer rows than 65 to another kernel
        layer(torch.ones(rows, 8, dtype=torch.bfloat16))
print(adaflash_hf.heap.ONEDNN_CACHE_ENV)
"""


def test_import_caps_the_onednn_primitive_cache_unless_the_user_set_it():
    """One oneDNN primitive per input shape, up to 1,024 by default, each with its own buffers: a trainer that
    meets a new batch shape every step climbs by hundreds of MiB. ``import adaflash_hf`` caps the cache before
    torch builds a primitive; a capacity the user set is kept."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != heap.ONEDNN_CACHE_ENV}

    def misses(**extra) -> int:
        run = subprocess.run(
            [sys.executable, "-c", ONEDNN_SHAPES],
            env={**env, "ONEDNN_VERBOSE": "profile_create", **extra},
            capture_output=True,
            text=True,
            check=True,
        )
        return sum("create:cache_miss" in line and ",matmul," in line for line in run.stdout.splitlines())

    odd = {**env, heap.ONEDNN_CACHE_ENV: "lots"}  # a value that is no number must not break the import
    subprocess.run([sys.executable, "-c", "import adaflash_hf"], env=odd, check=True)
    capped, users = misses(), misses(**{heap.ONEDNN_CACHE_ENV: "1024"})
    if users == 0:
        pytest.skip("torch runs bf16 linear layers without oneDNN on this CPU")
    assert heap.ONEDNN_CACHE_CAPACITY == 256 and users == 300 and capped == 600, (capped, users)


def test_a_stopped_trainer_reports_stopped_even_if_a_batch_was_under_way(pair):
    target, drafter = pair
    opd = _opd(target, drafter, worker="inline").start()
    opd.stop()
    opd.state = "training"  # what an inline batch that was running when stop() came sets as it ends
    assert opd.status()["state"] == "stopped"
    opd.start()
    opd.state = "dead"
    opd._inline_on = False
    assert opd.status()["state"] == "dead"


def test_opd_config_rejects_bad_values():
    with pytest.raises(ValueError, match="duty_cycle"):
        OPDConfig(duty_cycle=0)
    with pytest.raises(ValueError, match="alpha"):
        OPDConfig(alpha=2)
    with pytest.raises(ValueError, match="batch_trajectories"):
        OPDConfig(batch_trajectories=0)
    with pytest.raises(ValueError, match="replay_trajectories must be >= 0"):
        OPDConfig(replay_trajectories=-1)
    with pytest.raises(ValueError, match=r"max_retention_drop must be in \[0, 1\), got 1.5"):
        OPDConfig(max_retention_drop=1.5)
    with pytest.raises(ValueError, match="retention_trajectories and rehearsal_trajectories must be >= 0"):
        OPDConfig(rehearsal_trajectories=-2)
    with pytest.raises(ValueError, match="fault"):
        AdaFlashOPD.inject_fault(None, "meteor")


def test_opd_inputs_it_cannot_use_are_named(pair, tmp_path):
    from adaflash_hf.online.bench_opd import BenchOPDArgs

    target, drafter = pair
    with pytest.raises(TypeError, match="AdaFlashOPD trains an AdaFlashDrafter, got LlamaForCausalLM"):
        AdaFlashOPD(target, target, OPDConfig())
    serving = attach_lora(copy.deepcopy(drafter), LoraSettings(rank=4))
    with pytest.raises(ValueError, match="merge_adapter needs the base drafter"):
        merge_adapter(serving, tmp_path)
    with pytest.raises(AdapterError, match="no adapter_config.json in .*: not a published adapter folder"):
        merge_adapter(drafter, tmp_path)
    with pytest.raises(ValueError, match="LoRA rank must be >= 1"):
        LoraSettings(rank=0)
    with pytest.raises(ValueError, match="--shift-domain code is also in --trained-domains"):
        BenchOPDArgs(shift_domain="code", trained_domains="code,math")
    with pytest.raises(ValueError, match="unknown domain"):
        BenchOPDArgs(shift_domain="poetry")


def test_the_soak_survives_every_fault(pair):
    """A small soak through the serving scheduler: no request lost or changed, every fault recovered."""
    from adaflash_hf.online.soak import soak

    target, drafter = pair
    prompts = random_prompts([5, 7, 9, 6, 8, 4], seed=3)
    references = []
    for p in prompts:
        ids = torch.tensor([p])
        out = target.generate(
            ids, attention_mask=torch.ones_like(ids), max_new_tokens=16, do_sample=False, pad_token_id=0
        )[0, len(p) :].tolist()
        references.append(out[: out.index(3) + 1] if 3 in out else out)

    class Tokenizer:
        pad_token_id = 0

    report = soak(
        target,
        drafter,
        Tokenizer(),
        prompts,
        references,
        requests=80,
        concurrency=4,
        max_new_tokens=16,
        faults=["kill", "nan", "corrupt", "full"],
        opd_config=OPDConfig(
            min_trajectories=2,
            batch_trajectories=2,
            passes=1,
            steps_per_version=1,
            check_every=2,
            duty_cycle=1.0,
            lr=1e-2,
            buffer_trajectories=8,
        ),
    )
    assert not report["lost"] and not report["duplicated"] and not report["mismatched"], report
    assert {e["fault"] for e in report["faults"]} == {"kill", "nan", "corrupt", "full"}
    assert all(e["recovered"] for e in report["faults"]), report["faults"]
    assert report["passed"]


# ------------------------------------------------------------------------------------------------
# inline training: in the engine's thread, between rounds (the default on a CPU)
def test_auto_trains_inline_on_a_cpu(pair):
    target, drafter = pair
    assert OPDConfig().worker == "auto" and AdaFlashOPD(target, drafter).inline
    assert not AdaFlashOPD(target, drafter, OPDConfig(worker="thread")).inline
    with pytest.raises(ValueError, match="worker must be"):
        OPDConfig(worker="process")


def test_inline_training_runs_between_rounds_in_the_engine_thread_and_stays_lossless(pair, tmp_path):
    target, drafter = pair
    ids, mask = left_pad(random_prompts([5, 7, 9, 6]))
    reference = generate(target, None, ids, mask, max_new_tokens=24, do_sample=False).sequences
    opd = _opd(target, drafter, worker="inline", publish_dir=str(tmp_path)).start()
    threads = set()
    inner = opd._step
    opd._step = lambda batch: threads.add(threading.current_thread()) or inner(batch)
    for _ in range(12):  # every round first trains one batch (duty cycle 1), then swaps in what was published
        _serve(target, drafter, opd, 1, reference)
        if opd.slot.version >= 2:
            break
    opd.stop()
    status = opd.status()
    assert threads == {threading.current_thread()}  # no other thread ran torch
    assert status["worker"] == "inline" and status["steps"] > 0 and status["adapter_version"] >= 2, status
    assert status["swaps"] >= 2 and status["errors"] == []


def test_inline_training_keeps_to_its_duty_cycle():
    from adaflash_hf.online.opd import AdaFlashOPD as OPD

    opd = OPD.__new__(OPD)  # the budget logic alone: a fake 20 ms training batch, 5 ms rounds
    opd.inline, opd._inline_on, opd.state, opd._credit, opd._tick = True, True, "training", 0.0, time.perf_counter()
    opd.config, opd.idle_train_seconds, opd.errors = OPDConfig(duty_cycle=0.25), 0.0, []
    trained = []

    def work(wait):
        time.sleep(0.02)
        trained.append(0.02)
        return 0.02

    opd._work_once = work
    start = time.perf_counter()
    while time.perf_counter() - start < 1.5:
        opd.train_between_rounds()
        time.sleep(0.005)  # a round of serving
    share = sum(trained) / (time.perf_counter() - start)
    assert 0.15 < share < 0.32, share  # 0.25 of wall time (one batch of slack)
    before = len(trained)
    for _ in range(5):  # idle: no budget needed, and idle time does not count against it
        assert opd.train_between_rounds(idle=True)
    assert len(trained) == before + 5 and opd.idle_train_seconds == pytest.approx(0.1)


def test_an_inline_fault_stops_training_not_serving_and_is_restarted(pair):
    target, drafter = pair
    ids, mask = left_pad(random_prompts([5, 7, 9, 6]))
    reference = generate(target, None, ids, mask, max_new_tokens=24, do_sample=False).sequences
    opd = _opd(target, drafter, worker="inline", max_restarts=1).start()
    _serve(target, drafter, opd, 1, reference)  # data for the trainer
    opd.inject_fault("kill")
    opd._credit = 1.0
    _serve(target, drafter, opd, 1, reference)  # the next round's training dies; the round itself is served
    assert (
        opd.status()["state"] == "dead"
        and not opd.status()["worker_alive"]
        and "worker killed" in opd.status()["errors"]
    )
    assert opd.check_health() and opd.status()["restarts"] == 1 and opd.status()["worker_alive"]
    opd.inject_fault("nan")
    _serve(target, drafter, opd, 2, reference)
    assert opd.status()["nan_steps"] == 1 and opd.status()["worker_alive"]  # rolled back, training goes on
    opd.inject_fault("kill")
    opd._credit = 1.0  # the duty cycle lets the next round train even on a loaded machine (slow steps spend credit)
    _serve(target, drafter, opd, 1, reference)
    assert not opd.check_health() and opd.status()["state"] == "failed"  # out of restarts: reported
    _serve(target, drafter, opd, 1, reference)
    opd.stop()


def test_an_idle_scheduler_gives_its_thread_to_inline_training(pair):
    import asyncio

    from adaflash_hf.serving.loadtest import serve_while
    from adaflash_hf.serving.scheduler import RequestParams, Scheduler, SchedulerConfig

    target, drafter = pair
    opd = _opd(target, drafter, worker="inline", steps_per_version=1000, duty_cycle=0.01)
    scheduler = Scheduler(
        target, drafter, tokenizer=None, config=SchedulerConfig(max_batch_size=4, calibrate=False), opd=opd
    )
    prompts = random_prompts([5, 7, 9, 6], seed=4)
    reference = [greedy_reference(target, p, 16)[len(p) :] for p in prompts]

    async def client():
        first = await asyncio.gather(
            *(scheduler.submit(p, RequestParams(max_new_tokens=16)).collect() for p in prompts)
        )
        before = opd.status()["steps"]
        for _ in range(400):  # no requests: the engine trains (replaying what it has) instead of waiting
            if opd.status()["steps"] >= before + 3:
                break
            await asyncio.sleep(0.05)
        idle_steps = opd.status()["steps"] - before
        again = await asyncio.gather(
            *(scheduler.submit(p, RequestParams(max_new_tokens=16)).collect() for p in prompts)
        )
        return first, again, idle_steps

    first, again, idle_steps = serve_while(scheduler, client)
    assert idle_steps >= 3 and opd.status()["idle_train_seconds"] > 0
    assert [t for t, _ in first] == reference and [t for t, _ in again] == reference


def test_opd_on_a_packed_bf16_pair_trains_inline_and_serves():
    """The path of `adaflash serve --opd --dtype bf16` on a CPU: packed target and drafter weights."""
    from adaflash_hf.kernels import is_packed, pack_linear_weights, packing_available

    if not packing_available():
        pytest.skip("no oneDNN bf16 linear ops here")
    target = tiny_target("llama").to(torch.bfloat16)
    torch.manual_seed(1)
    drafter = AdaFlashDrafter.from_target(target, num_layers=2, block_size=5).to(torch.bfloat16).eval()
    pack_linear_weights(target, check_speed=False)
    pack_linear_weights(drafter, check_speed=False)
    ids, mask = left_pad(random_prompts([5, 7, 9, 6]))
    generate(target, drafter, ids, mask, max_new_tokens=12, do_sample=False)  # the packed (opaque) copies exist now
    opd = _opd(target, drafter, worker="inline").start()  # copies the packed drafter for its trainer
    assert is_packed(drafter)
    for _ in range(4):
        generate(target, drafter, ids, mask, max_new_tokens=12, do_sample=False, observer=opd.observer)
    opd.stop()
    assert opd.status()["steps"] > 0 and opd.status()["errors"] == [], opd.status()


def test_the_memory_check_compares_window_troughs():
    """Swings between samples (a trainer's batch allocated and freed) pass; a rising floor fails."""
    from adaflash_hf.online.soak import memory_check

    swinging = [1000.0 + (400 if i % 3 == 0 else 0) for i in range(120)]  # peaks 400 MiB above a flat floor
    check = memory_check(swinging)
    assert check["flat"] and check["growth_mb"] == 0 and check["allowed_mb"] == 200 and check["windows"] == 6
    leaking = [1000.0 + 3 * i for i in range(120)]  # +3 MiB a sample: 270 MiB over the 90 after warm-up
    check = memory_check(leaking)
    assert not check["flat"] and check["troughs_mb"][0] == 1090 and check["growth_mb"] == 225
    assert memory_check([500.0])["windows"] == 1
    with pytest.raises(ValueError, match="at least one RSS sample"):
        memory_check([])
