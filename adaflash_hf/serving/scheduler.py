"""Continuous batching with admission control: the serving engine behind ``adaflash serve``.

One engine thread owns the model. Between rounds it drops cancelled rows, admits queued requests
(prefilled together, then merged into the running batch), and steps the batch once; new tokens go
to each request's asyncio queue. Callers live on an asyncio loop::

    scheduler = Scheduler(target, drafter, tokenizer)
    scheduler.start()
    stream = scheduler.submit(prompt_ids, RequestParams(max_new_tokens=64))
    async for event in stream:          # TokenEvent(token_ids, finish_reason)
        ...
    scheduler.stop()

Admission (the adaptive part): a request joins when the batch has room (``max_batch_size``) and the
prefill budget between two rounds is not spent. The budget comes from the forward cost measured on
this machine (profiled at start-up, updated as rounds run): the prompt tokens whose prefill takes
about ``prefill_rounds`` decode rounds of the current batch, so a burst of long prompts joins over
several rounds instead of stalling every running stream. How many tokens each row verifies is the
verify policy's choice, from the same cost model: under load it shortens drafts, down to plain
steps when they do not pay.
The queue is bounded (``max_queue``): past it :meth:`Scheduler.submit` raises :class:`QueueFull`
with a retry hint. A request may carry a deadline (``RequestParams.timeout``): past it, queued or
running, it ends with finish_reason "timeout" and its row is freed before the next round.
:meth:`Scheduler.drain` stops admissions (``submit`` raises :class:`ShuttingDown`), lets the accepted
requests finish until a deadline, cancels what is left and ends the engine loop. All statistics are
bounded counters (per-position ones up to the drafter's block size), so a server can run for days.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable

import torch

from ..decoding.config import DraftingConfig
from ..decoding.drafting_state import DraftingState
from ..decoding.outputs import RoundStats
from ..decoding.policy import wants_drafts
from ..decoding.state import RowSpec, RowUpdate, SpeculativeBatch
from ..heap import HeapTrimmer
from .admission import Admission
from .requests import QueueFull, RequestParams, RequestStream, SchedulerConfig, ShuttingDown, TokenEvent

__all__ = ["QueueFull", "RequestParams", "RequestStream", "Scheduler", "SchedulerConfig", "ShuttingDown", "TokenEvent"]

logger = logging.getLogger(__name__)


class Scheduler(Admission):
    """Serve many concurrent requests from one target (and drafter) with continuous batching.

    Args:
        target, drafter, tokenizer: the models (drafter None: suffix drafting only).
        config: queue and batch limits (:class:`SchedulerConfig`).
        drafting / drafting_state / verify_policy: as for :func:`adaflash_hf.generate`; the default
            policy chooses verify lengths for the most expected tokens per second at the current load.
        model_name: the name clients see (``/v1/models``).
        max_context: most prompt + new tokens per request (default: the target's
            ``max_position_embeddings``).
    """

    def __init__(
        self,
        target,
        drafter,
        tokenizer,
        config: SchedulerConfig | None = None,
        *,
        drafting: DraftingConfig | None = None,
        drafting_state: DraftingState | None = None,
        verify_policy=None,
        model_name: str = "adaflash",
        max_context: int | None = None,
        generator: torch.Generator | None = None,
        opd=None,
    ):
        self.target, self.drafter, self.tokenizer = target, drafter, tokenizer
        # an AdaFlashOPD: records rounds and swaps adapters between them; started and stopped with the engine
        self.opd = opd
        self.config = config or SchedulerConfig()
        self.model_name = model_name
        self.max_context = max_context or int(getattr(target.config, "max_position_embeddings", 0) or 2048)
        self.vocab_size = target.get_output_embeddings().weight.shape[0]
        eos = target.generation_config.eos_token_id
        self.default_stop_ids = frozenset() if eos is None else frozenset(torch.tensor(eos).flatten().tolist())
        self.drafting_state = drafting_state or DraftingState(drafting)
        self.batch = SpeculativeBatch(
            target,
            drafter,
            drafting=drafting,
            drafting_state=self.drafting_state,
            verify_policy=verify_policy,
            generator=generator,
            on_round=self._on_round,
            observer=None if opd is None else opd.observer,
        )
        self._lock = threading.Condition()
        self._queue: deque[RequestStream] = deque()
        self._cancelled: set[str] = set()
        self._active: dict[str, RequestStream] = {}
        self._ids = itertools.count()
        self._thread: threading.Thread | None = None
        self._running = False
        self._serving = threading.Event()  # set while the engine loop takes requests
        self._stopped = threading.Event()  # set when the engine loop has ended
        self._calibrated = False
        self._heap = HeapTrimmer()  # finished rows leave freed cache pages that glibc would keep (adaflash_hf.heap)
        self._trimmed_at_finished = 0
        self.counters = {
            "submitted": 0,
            "finished": 0,
            "cancelled": 0,
            "errors": 0,
            "timeouts": 0,
            "rejected_queue_full": 0,
            "rejected_shutting_down": 0,
            "rounds": 0,
            "row_rounds": 0,
            "generated_tokens": 0,
            "round_tokens": 0,
            "verified_tokens": 0,
            "draft_failures": 0,  # rows whose drafter or length head raised or gave NaN: a plain step instead
        }
        self.source_counts: dict[str, int] = {}
        self.round_tokens_counts: dict[int, int] = {}  # tokens one row gained in one round -> row-rounds
        self.draft_counts: dict[tuple[str, int], list[int]] = {}  # (source, position) -> [proposed, accepted]
        self.batch_size = 0  # rows in the last round (0 once the engine idles)
        self._draining = False
        self._drain_deadline = 0.0  # time.monotonic() when draining cancels what is left
        self.mean_latency: float | None = None  # EMA of finished requests' latency, for Retry-After
        self.last_error: str | None = None

    # ----------------------------------------------------------------------------------------------
    # caller side (any thread with an asyncio loop)
    def start(self) -> None:
        """Start the engine in a background thread (it profiles the verify cost first: seconds to a minute).

        On a CPU with few cores prefer :meth:`run` in the thread that loaded the models: libgomp slows
        every OpenMP region once two OS threads own thread teams, and a background engine next to a
        main thread that ran torch work decodes at about half speed (22.4 vs 12.2 tok/s measured on 2 CPUs;
        :mod:`.torch_thread`).
        """
        with self._lock:
            if self._running:
                return
            self._running = True
            self._stopped.clear()
        self._thread = threading.Thread(target=self._engine, name="adaflash-engine", daemon=True)
        self._thread.start()

    def run(self, on_start: Callable[[], None] | None = None) -> None:
        """Run the engine in the calling thread until :meth:`stop` is called from another thread
        (or a signal raises ``KeyboardInterrupt`` here). ``adaflash serve`` runs it in the main thread,
        with the HTTP server in a background thread, so that one OS thread does all torch work.

        ``on_start`` is called once the scheduler admits requests and before the loop begins (``serve`` opens
        its port there, so that no request arrives before the scheduler takes it)."""
        with self._lock:
            if self._running:
                raise RuntimeError("the scheduler is already running: call stop() first.")
            self._running = True
            self._stopped.clear()
        self._thread = threading.current_thread()
        try:
            if on_start is not None:
                on_start()
            self._engine()
        finally:
            with self._lock:
                self._running = False
                self._lock.notify_all()

    @property
    def ready(self) -> bool:
        """Whether the engine loop takes requests now (not while it starts up, profiles costs or after it stopped)."""
        return self._serving.is_set()

    def wait_until_running(self, timeout: float | None = None) -> bool:
        """Block until the engine loop takes requests (after its verify-cost profile); False on timeout."""
        return self._serving.wait(timeout)

    def calibrate(self) -> None:
        """Profile the verify cost once (``config.calibrate``); the engine does it before its first round.
        Call it from the thread that runs the engine."""
        if not self.config.calibrate or self._calibrated:
            return
        self._calibrated = True
        longest = (self.drafter.config.block_size if self.drafter is not None else 16) + 1  # anchor + a whole proposal
        counts = [
            n
            for n in (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
            if n <= max(self.config.max_batch_size * longest, 16)
        ]
        try:
            start = time.perf_counter()
            self.drafting_state.cost_model.calibrate(self.target, counts)
            sizes = [n for n in (2, 4, 8, 16, 32, 64, 128) if n <= self.config.max_batch_size]
            rows = sorted({r for r in (*sizes, self.config.max_batch_size) if r > 1})
            widths = (
                tuple(w for w in (1, 2, 3, 5, 9, 17) if w <= longest) if wants_drafts(self.batch.policy, 2) else (1,)
            )
            self.drafting_state.cost_model.calibrate_rows(self.target, rows, widths=widths)
            logger.info(
                "verify cost profiled for %s tokens and %s rows x %s tokens in %.1fs",
                counts,
                rows,
                widths,
                time.perf_counter() - start,
            )
        except Exception:  # a failed profile only costs the policy its head start
            logger.exception("verify cost profile failed; the policy will learn costs as rounds run")

    def stop(self, timeout: float = 30.0) -> None:
        """Stop the engine; requests still queued or running end with finish_reason "cancelled".
        From another thread it waits (up to ``timeout`` s) until the engine loop has ended."""
        if self.opd is not None:
            self.opd.stop()
        with self._lock:
            was_running = self._running
            self._running = False
            self._lock.notify_all()
        if was_running and self._thread is not threading.current_thread():
            self._stopped.wait(timeout)  # run() in another thread or start()'s thread: both set it as the loop ends

    @property
    def draining(self) -> bool:
        """Whether :meth:`drain` was called: no new request is admitted."""
        return self._draining

    def drain(self, timeout: float) -> None:
        """Admit no new request and end the engine loop once the accepted ones have finished, or after
        ``timeout`` seconds, when what is left ends "cancelled". Safe from a signal handler: it only sets
        flags and wakes the engine."""
        with self._lock:
            if not self._draining:
                logger.info(
                    "draining: %d running and %d queued requests may finish within %.0f s",
                    len(self._active),
                    len(self._queue),
                    timeout,
                )
            self._draining = True
            self._drain_deadline = time.monotonic() + timeout
            self._lock.notify_all()

    def status(self) -> dict:
        with self._lock:
            c = dict(self.counters)
            return {
                "running": self._running,
                "draining": self._draining,
                "queued": len(self._queue),
                "active": len(self._active),
                "max_batch_size": self.config.max_batch_size,
                "max_queue": self.config.max_queue,
                "counters": c,
                "sources": dict(self.source_counts),
                "mean_accepted_length": c["round_tokens"] / c["row_rounds"] if c["row_rounds"] else None,
                "verified_per_token": c["verified_tokens"] / c["round_tokens"] if c["round_tokens"] else None,
                "last_error": self.last_error,
                "opd": None if self.opd is None else self.opd.status(),
            }

    def round_stats(self) -> dict:
        """Bounded round statistics for metrics: rows in the last round, row-rounds by tokens gained, and
        drafts proposed and accepted by (source, position); position 1 is the draft after the anchor."""
        with self._lock:
            return {
                "batch_size": self.batch_size,
                "round_tokens": dict(self.round_tokens_counts),
                "drafts": {key: tuple(value) for key, value in self.draft_counts.items()},
            }

    # ----------------------------------------------------------------------------------------------
    # engine thread
    def _engine(self) -> None:
        """The engine loop, in whichever thread runs it: profile, start OPD, serve rounds, end requests."""
        try:
            with torch.no_grad():  # restored on exit: run() may be called from the caller's own thread
                self.calibrate()
                if self.opd is not None:
                    self.opd.start()
                self._serving.set()
                self._run()
        finally:  # stopped, or (a bug) the loop itself failed: either way no request is left waiting
            self._serving.clear()
            with self._lock:
                self._running = False
            self._fail_all(None)
            self._stopped.set()

    def _run(self) -> None:
        idle_training = False
        while True:
            with self._lock:
                while self._running and not self._queue and not self._active:
                    if self._draining:
                        self._running = False  # drained: nothing accepted is left
                        break
                    if self.opd is not None and self.opd.inline and self.opd.wants_idle_time():
                        idle_training = True  # no requests: the inline OPD trainer gets the engine's thread
                        break
                    self.batch_size = 0
                    self._lock.wait()
                if self._draining and time.monotonic() >= self._drain_deadline:
                    logger.warning(
                        "drain deadline passed: cancelling %d running and %d queued requests",
                        len(self._active),
                        len(self._queue),
                    )
                    self._running = False
                if not self._running:
                    break
                cancelled, self._cancelled = self._cancelled, set()
                expired = self._expire_queued()
                admitted = self._admit()
            if idle_training and not admitted and not len(self.batch):
                idle_training = False
                if not self.opd.train_between_rounds(idle=True):
                    self.opd.check_health()  # a fault ended inline training: restart it (bounded) or report it
                    with self._lock:  # nothing trained: wait for a request (or more data) instead of spinning
                        if self._running and not self._queue:
                            self._lock.wait(0.5)
                continue
            idle_training = False
            try:
                self._drop(cancelled)
                self._drop(expired, "timeout")
                if admitted:
                    self._deliver(
                        self.batch.add_rows(
                            [
                                RowSpec(
                                    s.request_id,
                                    s.prompt_ids,
                                    s.params.max_new_tokens,
                                    s.params.sampling(),
                                    frozenset(s.params.stop_token_ids) or self.default_stop_ids,
                                )
                                for s in admitted
                            ]
                        )
                    )
                if len(self.batch):
                    self._deliver(self.batch.step())
                    if self.opd is not None:
                        # restarts a dead trainer (bounded; a thread liveness check); serving never waits on it
                        self.opd.check_health()
                ended = sum(self.counters[key] for key in ("finished", "cancelled", "errors", "timeouts"))
                if ended != self._trimmed_at_finished and self._heap.maybe_trim():
                    self._trimmed_at_finished = ended
            except Exception as error:  # a failed round ends its requests, never the server
                logger.exception("engine round failed")
                self._fail_all(f"{type(error).__name__}: {error}")

    def _drop(self, request_ids: set[str], reason: str = "cancelled") -> None:
        ids = [i for i in request_ids if i in self._active]
        if not ids:
            return
        self.batch.drop_rows(ids)
        for request_id in ids:
            self._finish(request_id, TokenEvent([], reason))

    def _deliver(self, updates: list[RowUpdate]) -> None:
        for update in updates:
            stream = self._active.get(update.row_id)
            if stream is None:
                continue
            self.counters["generated_tokens"] += len(update.tokens)
            if update.finish_reason is None:
                stream._push(TokenEvent(update.tokens))
            else:
                self._finish(update.row_id, TokenEvent(update.tokens, update.finish_reason))

    def _finish(self, request_id: str, event: TokenEvent) -> None:
        with self._lock:
            stream = self._active.pop(request_id, None)
            if stream is None:
                return
            key = {"cancelled": "cancelled", "error": "errors", "timeout": "timeouts"}.get(
                event.finish_reason, "finished"
            )
            self.counters[key] += 1
        stream._push(event)
        latency = stream.done_at - stream.submitted
        self.mean_latency = latency if self.mean_latency is None else 0.9 * self.mean_latency + 0.1 * latency

    def _fail_all(self, message: str | None) -> None:
        """End every active (and, when stopping, queued) request; reset the batch."""
        if message is not None:
            self.last_error = message
        for request_id in list(self._active):
            self._finish(request_id, TokenEvent([], "error" if message else "cancelled", message))
        if message is None:
            with self._lock:
                while self._queue:
                    self._queue.popleft()._push(TokenEvent([], "cancelled"))
        self.batch.drop_rows(list(self.batch.ids))

    def _on_round(self, stats: RoundStats) -> None:
        c = self.counters
        c["rounds"] += 1
        c["draft_failures"] += stats.draft_failures
        self.batch_size = len(stats.rows)
        checked = stats.checked or [verified - 1 for verified in stats.verify_lens]
        for row, accepted, verified, source, drafts in zip(
            stats.rows, stats.accept_lengths, stats.verify_lens, stats.sources, checked
        ):
            c["row_rounds"] += 1
            c["round_tokens"] += accepted + 1
            c["verified_tokens"] += verified
            self.source_counts[source] = self.source_counts.get(source, 0) + 1
            self.round_tokens_counts[accepted + 1] = self.round_tokens_counts.get(accepted + 1, 0) + 1
            for position in range(1, drafts + 1):  # along the accepted path: a tree's depth, a chain's index
                counts = self.draft_counts.setdefault((source, position), [0, 0])
                counts[0] += 1
                counts[1] += position <= accepted
            stream = self._active.get(row)
            if stream is not None:
                stream.rounds += 1
                stream.round_tokens += accepted + 1
                stream.verified += verified
