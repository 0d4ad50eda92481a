"""Admission control of the :class:`~.scheduler.Scheduler`: the bounded queue and who joins before a round.

Callers queue requests with :meth:`Admission.submit` (refused with :class:`QueueFull` past ``max_queue``, with a
Retry-After hint from the mean latency, or :class:`ShuttingDown` while draining). Between rounds the engine
thread ends queued requests past their deadline and pops those that may join: while the batch has room and the
prefill budget (the prompt tokens whose measured forward cost fits in ``prefill_rounds`` plain rounds of the
current batch) is not spent.
"""

from __future__ import annotations

import asyncio
import time

from .requests import EngineNotRunning, QueueFull, RequestParams, RequestStream, ShuttingDown, TokenEvent


class Admission:
    """The queue half of :class:`~.scheduler.Scheduler`: requests in, and the ones that join the next round."""

    def submit(self, prompt_ids: list[int], params: RequestParams) -> RequestStream:
        """Queue a request; call from a running asyncio loop. Raises ValueError, :class:`QueueFull`,
        :class:`ShuttingDown` (a `QueueFull`: the engine is draining) or :class:`EngineNotRunning` (a
        `ShuttingDown` and a `RuntimeError`: the engine loop has not started or has ended)."""
        loop = asyncio.get_running_loop()
        prompt_ids = [int(t) for t in prompt_ids]
        if not prompt_ids:
            raise ValueError("the prompt is empty: give at least one token.")
        bad = [t for t in prompt_ids if not 0 <= t < self.vocab_size]
        if bad:
            raise ValueError(f"prompt token ids {bad[:5]} are outside the vocabulary (0..{self.vocab_size - 1}).")
        if len(prompt_ids) + params.max_new_tokens > self.max_context:
            raise ValueError(
                f"the prompt has {len(prompt_ids)} tokens and asks for {params.max_new_tokens} more, past this model's "
                f"context of {self.max_context} tokens: shorten the prompt or lower max_tokens."
            )
        with self._lock:
            if not self._running and not self._draining:
                raise EngineNotRunning("the scheduler is not running: call start() or run() first.", retry_after=5.0)
            if self._draining:
                self.counters["rejected_shutting_down"] += 1
                raise ShuttingDown(
                    "the server is shutting down and takes no new requests; retry on another "
                    "replica or once it is back.",
                    retry_after=5.0,
                )
            if len(self._queue) >= self.config.max_queue:
                self.counters["rejected_queue_full"] += 1
                raise QueueFull(
                    f"the queue is full ({self.config.max_queue} requests waiting); retry later.",
                    retry_after=self._retry_after(),
                )
            stream = RequestStream(self, f"req-{next(self._ids)}", prompt_ids, params, loop)
            self._queue.append(stream)
            self.counters["submitted"] += 1
            self._lock.notify_all()
        return stream

    def _cancel(self, stream: RequestStream) -> None:
        with self._lock:
            if stream.finished or stream.cancelled:
                return
            stream.cancelled = True
            if stream in self._queue:
                self._queue.remove(stream)
                self.counters["cancelled"] += 1
                stream._push(TokenEvent([], "cancelled"))
            else:
                self._cancelled.add(stream.request_id)
            self._lock.notify_all()

    def _retry_after(self) -> float:
        per_request = self.mean_latency or 1.0
        return round(max(1.0, per_request * len(self._queue) / self.config.max_batch_size), 1)

    # ----------------------------------------------------------------------------------------------
    # engine thread (lock held)
    def _expire_queued(self) -> set[str]:
        """End queued requests past their deadline; return the running ones past it (lock held)."""
        now = time.perf_counter()
        for stream in [s for s in self._queue if s.deadline is not None and now >= s.deadline]:
            self._queue.remove(stream)
            self.counters["timeouts"] += 1
            stream._push(TokenEvent([], "timeout"))
        return {i for i, s in self._active.items() if s.deadline is not None and now >= s.deadline}

    def _admit(self) -> list[RequestStream]:
        """Pop the requests that may join before the next round (lock held)."""
        admitted, tokens = [], 0
        budget = self._prefill_budget()
        while self._queue:
            candidate = self._queue[0]
            if len(self._active) + len(admitted) >= self.config.max_batch_size:
                break
            if admitted and tokens + len(candidate.prompt_ids) > budget:
                break
            self._queue.popleft()
            candidate.admitted = time.perf_counter()
            admitted.append(candidate)
            self._active[candidate.request_id] = candidate
            tokens += len(candidate.prompt_ids)
        return admitted

    def _prefill_budget(self) -> int:
        """Prompt tokens that may be prefilled before the next round (lock held).

        With adaptive admission and rows decoding, it is the largest count whose measured forward cost
        fits in ``prefill_rounds`` plain rounds of the current batch, so a burst of long prompts joins
        over several rounds instead of stalling every running stream at once.
        """
        cap = self.config.max_prefill_tokens
        cost = self.drafting_state.cost_model
        if not self.config.adaptive_admission or not self._active or not cost.seconds:
            return cap
        allowed = self.config.prefill_rounds * cost.cost_batch(len(self._active), 1)
        low, high = 1, cap
        while low < high:  # largest n with cost(n) <= allowed (cost grows with n)
            mid = (low + high + 1) // 2
            low, high = (mid, high) if cost.cost(mid) <= allowed else (low, mid - 1)
        return low
