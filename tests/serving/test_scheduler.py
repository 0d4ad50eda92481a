"""The continuous-batching scheduler: concurrent requests, joins mid-generation, cancellation, back-pressure."""

from __future__ import annotations

import asyncio
import time

import pytest

from adaflash_hf import AdaFlashDrafter
from adaflash_hf.serving.scheduler import (
    QueueFull,
    RequestParams,
    RequestStream,
    Scheduler,
    SchedulerConfig,
    ShuttingDown,
)

from conftest import EOS, greedy_reference, random_prompts, tiny_target


@pytest.fixture
def scheduler(target, drafter):
    scheduler = Scheduler(target, drafter, tokenizer=None, config=SchedulerConfig(max_batch_size=3, max_queue=16))
    scheduler.start()
    yield scheduler
    scheduler.stop()


def test_concurrent_requests_joining_mid_generation_equal_the_target(scheduler, target):
    prompts = random_prompts([4, 9, 6, 12, 5, 7], seed=11)
    budgets = [14, 6, 20, 9, 17, 11]

    async def client(i):
        await asyncio.sleep(0.01 * i)  # staggered: later requests join a batch that is already decoding
        stream = scheduler.submit(prompts[i], RequestParams(max_new_tokens=budgets[i]))
        return await stream.collect(), stream.metrics

    async def main():
        return await asyncio.gather(*(client(i) for i in range(len(prompts))))

    results = asyncio.run(main())
    for i, ((tokens, reason), metrics) in enumerate(results):
        reference = greedy_reference(target, prompts[i], budgets[i])[len(prompts[i]) :]
        assert tokens == reference, f"request {i}"
        assert reason == ("stop" if reference[-1] == EOS else "length")
        assert metrics["num_tokens"] == len(tokens) and metrics["ttft_s"] is not None
    status = scheduler.status()
    assert status["counters"]["finished"] == len(prompts) and status["active"] == 0 and status["queued"] == 0
    assert status["mean_accepted_length"] >= 1.0


@pytest.mark.parametrize("mode", ["suffix", "plain"])
def test_without_a_drafter_requests_still_equal_the_target(target, mode):
    from adaflash_hf import DraftingConfig, DraftingState, FixedVerifyLength

    drafting = DraftingConfig(drafter=False)
    scheduler = Scheduler(
        target,
        None,
        tokenizer=None,
        config=SchedulerConfig(max_batch_size=2, calibrate=False),
        drafting=drafting,
        drafting_state=DraftingState(drafting),
        verify_policy=FixedVerifyLength(1) if mode == "plain" else None,
    )
    scheduler.start()
    prompts = random_prompts([4, 9, 6, 5], seed=13)

    async def client(i):
        await asyncio.sleep(0.005 * i)
        return await scheduler.submit(prompts[i], RequestParams(max_new_tokens=10 + i)).collect()

    async def main():
        return await asyncio.gather(*(client(i) for i in range(len(prompts))))

    try:
        results = asyncio.run(main())
    finally:
        scheduler.stop()
    for i, (tokens, _) in enumerate(results):
        assert tokens == greedy_reference(target, prompts[i], 10 + i)[len(prompts[i]) :], f"request {i}"
    if mode == "plain":
        assert scheduler.status()["mean_accepted_length"] == 1.0


def test_cancel_mid_stream_frees_the_row(scheduler, target):
    prompts = random_prompts([5, 8], seed=2)

    async def main():
        long = scheduler.submit(prompts[0], RequestParams(max_new_tokens=200, stop_token_ids=[10_000 % 48 + 100]))
        other = scheduler.submit(prompts[1], RequestParams(max_new_tokens=12))
        seen = []
        async for event in long:
            seen.extend(event.token_ids)
            if len(seen) >= 3 and not long.cancelled:
                long.cancel()
            if event.finish_reason:
                break
        return event.finish_reason, await other.collect()

    reason, (tokens, _) = asyncio.run(main())
    assert reason == "cancelled"
    assert tokens == greedy_reference(target, prompts[1], 12)[len(prompts[1]) :]
    assert scheduler.status()["counters"]["cancelled"] == 1


def test_full_queue_raises_with_a_retry_hint(target, drafter):
    scheduler = Scheduler(target, drafter, tokenizer=None, config=SchedulerConfig(max_batch_size=1, max_queue=2))
    scheduler.start()
    try:

        async def main():
            streams = []
            with pytest.raises(QueueFull) as info:
                for _ in range(10):
                    streams.append(scheduler.submit([5, 6, 7], RequestParams(max_new_tokens=30)))
            assert info.value.retry_after >= 1 and len(streams) >= 2
            for s in streams:
                s.cancel()
            return [await s.collect() for s in streams]

        results = asyncio.run(main())
        assert all(reason in ("cancelled", "length", "stop") for _, reason in results)
    finally:
        scheduler.stop()


@pytest.mark.parametrize(
    "prompt, params, message",
    [
        ([], dict(max_new_tokens=4), "prompt is empty"),
        ([5, 999], dict(max_new_tokens=4), "outside the vocabulary"),
        ([5] * 500, dict(max_new_tokens=100), "context of 512 tokens"),
    ],
)
def test_bad_requests_are_refused_clearly(scheduler, prompt, params, message):
    async def main():
        scheduler.submit(prompt, RequestParams(**params))

    with pytest.raises(ValueError, match=message):
        asyncio.run(main())


@pytest.mark.parametrize(
    "params, message",
    [
        (dict(max_new_tokens=0), "max_new_tokens"),
        (dict(max_new_tokens=4, temperature=-1), "temperature"),
        (dict(max_new_tokens=4, temperature=1, top_p=1.5), "top_p"),
    ],
)
def test_bad_parameters_are_refused_clearly(params, message):
    with pytest.raises(ValueError, match=message):
        RequestParams(**params)


def test_the_server_keeps_serving_after_a_failed_round(scheduler, target, monkeypatch):
    prompts = random_prompts([5, 6], seed=4)
    original = scheduler.batch.step
    calls = {"n": 0}

    def flaky_step():
        calls["n"] += 1
        if calls["n"] == 2:
            raise RuntimeError("injected failure")
        return original()

    monkeypatch.setattr(scheduler.batch, "step", flaky_step)

    async def main():
        first = await scheduler.submit(prompts[0], RequestParams(max_new_tokens=10)).collect()
        second = await scheduler.submit(prompts[1], RequestParams(max_new_tokens=10)).collect()
        return first, second

    (_, first_reason), (tokens, _) = asyncio.run(main())
    assert first_reason == "error" and "injected failure" in scheduler.status()["last_error"]
    assert tokens == greedy_reference(target, prompts[1], 10)[len(prompts[1]) :]


def test_memory_stays_flat_over_500_requests():
    """Every structure a long-running server keeps is bounded: after 500 requests nothing per-request is left,
    the global suffix index sits at its cap (set low here so it fills up), and no streams, queues,
    tensors or caches pile up over the last 300 requests (one leaked per request would add hundreds)."""
    import gc

    import torch
    from transformers import DynamicCache

    from adaflash_hf import DraftingConfig, DraftingState

    target = tiny_target("llama")
    drafter = AdaFlashDrafter.from_target(target, num_layers=2, block_size=5).eval()
    drafting = DraftingConfig(global_max_tokens=500)
    scheduler = Scheduler(
        target,
        drafter,
        tokenizer=None,
        config=SchedulerConfig(max_batch_size=16, calibrate=False),
        drafting=drafting,
        drafting_state=DraftingState(drafting),
    )
    scheduler.start()
    prompts = random_prompts([5 + i % 7 for i in range(500)], seed=17)

    async def run(batch):
        semaphore = asyncio.Semaphore(16)

        async def one(prompt):
            async with semaphore:
                return await scheduler.submit(prompt, RequestParams(max_new_tokens=4)).collect()

        return await asyncio.gather(*(one(p) for p in batch))

    def live_objects() -> int:  # what a request could leak: its stream and queue, tensors, caches
        gc.collect()
        kinds = (RequestStream, asyncio.Queue, torch.Tensor, DynamicCache)
        return sum(isinstance(o, kinds) for o in gc.get_objects())

    try:
        asyncio.run(run(prompts[:200]))
        after_200 = live_objects()
        results = asyncio.run(run(prompts[200:]))
        growth = live_objects() - after_200
    finally:
        scheduler.stop()
    assert all(len(tokens) >= 1 for tokens, _ in results)
    assert scheduler.status()["counters"]["finished"] == 500, scheduler.status()["counters"]
    assert growth < 50, f"{growth} more live streams, queues, tensors or caches after 300 more requests"
    assert not scheduler._active and not scheduler.batch.ids and not scheduler.batch.specs
    assert not scheduler.batch.proposer.history and not scheduler.batch.proposer.rows
    assert scheduler.drafting_state.global_index.num_tokens <= 500 + 20


def test_the_engine_hands_freed_heap_back_after_requests_finish_at_a_bounded_rate(target, drafter, monkeypatch):
    """Finished rows free cache pages that glibc would keep for good (``adaflash_hf.heap``): the engine trims after
    requests end, never more often than its trimmer's interval, and not while nothing has finished."""
    from adaflash_hf import heap

    calls = []
    monkeypatch.setattr(heap, "release_freed_heap", lambda: calls.append(1))
    scheduler = Scheduler(target, drafter, tokenizer=None, config=SchedulerConfig(max_batch_size=2, calibrate=False))
    scheduler._heap = heap.HeapTrimmer(interval=0.0)
    scheduler.start()
    prompts = random_prompts([5, 7, 6], seed=3)

    async def run(interval):
        scheduler._heap.interval = interval
        return [await scheduler.submit(p, RequestParams(max_new_tokens=6)).collect() for p in prompts]

    try:
        asyncio.run(run(0.0))
        assert 1 <= len(calls) <= len(prompts)  # one per finished request at most, however many rounds ran
        before = len(calls)
        asyncio.run(run(3600.0))
    finally:
        scheduler.stop()
    assert len(calls) == before


def test_the_engine_runs_in_the_calling_thread_until_stopped_from_another(target, drafter):
    """Scheduler.run(): the engine in this thread (as adaflash serve runs it), clients in another; stop() ends it."""
    import threading

    from adaflash_hf.serving.loadtest import serve_while

    scheduler = Scheduler(target, drafter, tokenizer=None, config=SchedulerConfig(max_batch_size=2, calibrate=False))
    prompts = random_prompts([5, 8, 6], seed=21)
    engine_threads = set()
    inner = scheduler.batch.step
    scheduler.batch.step = lambda: engine_threads.add(threading.current_thread()) or inner()

    async def client():
        return await asyncio.gather(*(scheduler.submit(p, RequestParams(max_new_tokens=9)).collect() for p in prompts))

    with pytest.raises(RuntimeError, match="not running"):
        asyncio.run(client())
    results = serve_while(scheduler, client)
    assert engine_threads == {threading.current_thread()}  # every round ran here, none in the client's thread
    import torch

    assert torch.is_grad_enabled()  # the engine's no-grad mode ended with run()
    for prompt, (tokens, _) in zip(prompts, results):
        assert tokens == greedy_reference(target, prompt, 9)[len(prompt) :]
    assert not scheduler.status()["running"]
    again = serve_while(scheduler, client)  # a stopped scheduler runs again
    assert [t for t, _ in again] == [t for t, _ in results]

    async def failing():
        raise ValueError("client broke")

    with pytest.raises(
        ValueError, match="client broke"
    ):  # the client's error reaches the engine's thread; the engine stops
        serve_while(scheduler, failing)
    assert not scheduler.status()["running"]


def test_a_torch_thread_runs_calls_and_generators_in_one_thread():
    import threading

    from adaflash_hf.serving.torch_thread import TorchThread, torch_thread

    worker = TorchThread()
    seen = []

    def steps():
        for i in range(3):
            seen.append(threading.current_thread())
            yield i

    assert list(worker.iterate(steps())) == [0, 1, 2]
    assert len(set(seen)) == 1 and seen[0] is not threading.current_thread()
    assert worker.call(threading.current_thread) is seen[0]
    with pytest.raises(ZeroDivisionError):
        worker.call(lambda: 1 / 0)
    assert torch_thread() is torch_thread()


@pytest.fixture
def llama_scheduler():
    """One architecture is enough for admission, drain and deadline logic: the engine rounds are the same."""
    target = tiny_target("llama")
    drafter = AdaFlashDrafter.from_target(target, num_layers=1, block_size=4).eval()
    scheduler = Scheduler(
        target, drafter, tokenizer=None, config=SchedulerConfig(max_batch_size=1, max_queue=8, calibrate=False)
    )
    scheduler.start()
    assert scheduler.wait_until_running(30)
    yield scheduler, target
    scheduler.stop()


NEVER = 10_000  # a stop id outside the vocabulary: a request runs to max_new_tokens


def test_drain_finishes_the_accepted_requests_refuses_new_ones_and_ends_the_loop(llama_scheduler):
    scheduler, target = llama_scheduler
    prompts = random_prompts([5, 7], seed=31)

    async def main():
        streams = [scheduler.submit(p, RequestParams(max_new_tokens=16, stop_token_ids=[NEVER])) for p in prompts]
        scheduler.drain(30)  # one runs, one waits in the queue: both were accepted, both finish
        with pytest.raises(ShuttingDown, match="shutting down"):
            scheduler.submit(prompts[0], RequestParams(max_new_tokens=4))
        return [await s.collect() for s in streams]

    results = asyncio.run(main())
    for prompt, (tokens, reason) in zip(prompts, results):
        assert reason == "length" and tokens == greedy_reference(target, prompt, 16)[len(prompt) :]
    assert scheduler._stopped.wait(10), "the engine loop ended once drained"
    status = scheduler.status()
    assert not status["running"] and status["draining"] and status["counters"]["rejected_shutting_down"] == 1


def test_past_the_drain_deadline_what_is_left_is_cancelled(llama_scheduler):
    scheduler, _ = llama_scheduler

    async def main():
        stream = scheduler.submit([5, 6, 7], RequestParams(max_new_tokens=400, stop_token_ids=[NEVER]))
        async for event in stream:
            if event.token_ids:
                break
        scheduler.drain(0)
        tokens, reason = await stream.collect()
        return reason, len(tokens)

    reason, tokens = asyncio.run(main())
    assert reason == "cancelled" and tokens < 400
    assert scheduler._stopped.wait(10)


def test_deadlines_end_queued_and_running_requests_and_free_their_rows(llama_scheduler):
    scheduler, target = llama_scheduler
    with pytest.raises(ValueError, match="timeout=0: must be a number of seconds > 0"):
        RequestParams(max_new_tokens=4, timeout=0)

    async def main():
        running = scheduler.submit([5, 6, 7], RequestParams(max_new_tokens=400, stop_token_ids=[NEVER], timeout=600))
        async for event in running:
            if event.token_ids:
                break
        queued = scheduler.submit([8, 9], RequestParams(max_new_tokens=4, timeout=1e-6))  # the batch (1 row) is full
        queued_result = await queued.collect()
        running.deadline = 0.0  # as if its 600 s had passed
        running_result = await running.collect()
        after = scheduler.submit([8, 9], RequestParams(max_new_tokens=4))  # the freed row serves the next request
        return queued_result, running_result, await after.collect()

    (queued_tokens, queued_reason), (_, running_reason), (tokens, reason) = asyncio.run(main())
    assert (queued_tokens, queued_reason, running_reason) == ([], "timeout", "timeout")
    assert reason == "length" and tokens == greedy_reference(target, [8, 9], 4)[2:]
    counters = scheduler.status()["counters"]
    assert counters["timeouts"] == 2 and scheduler.status()["active"] == 0


def test_round_statistics_stay_bounded_and_add_up(llama_scheduler):
    scheduler, _ = llama_scheduler

    async def main():
        params = RequestParams(max_new_tokens=24, stop_token_ids=[NEVER])
        prompts = random_prompts([4, 6, 9], seed=41)
        return await asyncio.gather(*(scheduler.submit(p, params).collect() for p in prompts))

    asyncio.run(main())
    stats, counters = scheduler.round_stats(), scheduler.status()["counters"]
    assert sum(stats["round_tokens"].values()) == counters["row_rounds"]
    assert sum(tokens * rows for tokens, rows in stats["round_tokens"].items()) == counters["round_tokens"]
    assert stats["drafts"] and all(position >= 1 for _, position in stats["drafts"])
    assert len(stats["drafts"]) <= 4 * 32  # sources x the longest draft: bounded, however many rounds ran
    for (source, position), (proposed, accepted) in stats["drafts"].items():
        assert 0 <= accepted <= proposed
        if position > 1:  # a draft is verified only after the one before it was accepted or verified
            assert proposed <= stats["drafts"][(source, position - 1)][0]
    deadline = time.monotonic() + 10
    while scheduler.round_stats()["batch_size"] and time.monotonic() < deadline:
        time.sleep(0.01)
    assert scheduler.round_stats()["batch_size"] == 0  # idle again
