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
with a retry hint. All statistics are bounded counters, so a server can run for days.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading
import time
from collections import deque
from dataclasses import dataclass, field

import torch

from ..decoding.config import DraftingConfig
from ..decoding.drafting_state import DraftingState
from ..decoding.outputs import RoundStats
from ..decoding.policy import wants_drafts
from ..decoding.sampling import SamplingParams
from ..decoding.state import RowSpec, RowUpdate, SpeculativeBatch
from ..heap import HeapTrimmer

logger = logging.getLogger(__name__)


@dataclass
class SchedulerConfig:
    max_batch_size: int = field(default=32, metadata={"help": "Most requests decoding at once."})
    max_queue: int = field(default=256, metadata={"help": "Most requests waiting; past it, new ones get HTTP 429."})
    max_prefill_tokens: int = field(default=4096, metadata={"help": "Most prompt tokens admitted between two rounds."})
    adaptive_admission: bool = field(default=True, metadata={"help": "Cap the prompt tokens prefilled between two rounds at what the measured cost says takes prefill_rounds decode rounds (at least one request joins per round), so running requests keep streaming while new ones join."})
    prefill_rounds: float = field(default=4.0, metadata={"help": "With adaptive admission: decode rounds' worth of time one admission may take."})
    calibrate: bool = field(default=True, metadata={"help": "Time target forwards of 1 to max_batch_size x (block + 1) tokens at start-up, so verify lengths and admission know this machine's costs from the first request."})

    def __post_init__(self):
        for name in ("max_batch_size", "max_queue", "max_prefill_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)}: must be >= 1.")
        if not self.prefill_rounds > 0:
            raise ValueError(f"prefill_rounds={self.prefill_rounds}: must be > 0.")


@dataclass
class RequestParams:
    """Per-request decoding parameters (the OpenAI request's fields, in token terms)."""

    max_new_tokens: int
    temperature: float = 0.0
    top_p: float | None = None
    top_k: int | None = None
    stop_token_ids: list[int] = field(default_factory=list)  # empty: the target's EOS ids
    seed: int | None = None  # accepted for compatibility; rows share one RNG in a continuous batch

    def __post_init__(self):
        if not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens={self.max_new_tokens!r}: must be an integer >= 1.")
        if self.temperature < 0:
            raise ValueError(f"temperature={self.temperature}: must be >= 0 (0 is greedy).")
        if self.top_p is not None and not 0 < self.top_p <= 1:
            raise ValueError(f"top_p={self.top_p}: must be in (0, 1].")
        self.sampling()  # validates top_k

    def sampling(self) -> SamplingParams:
        if self.temperature == 0:
            return SamplingParams()
        return SamplingParams(do_sample=True, temperature=self.temperature, top_k=self.top_k,
                              top_p=self.top_p if self.top_p is not None and self.top_p < 1 else None)


@dataclass
class TokenEvent:
    token_ids: list[int]
    finish_reason: str | None = None  # "stop", "length", "cancelled" or "error" on the last event
    error: str | None = None


class QueueFull(Exception):
    def __init__(self, message: str, retry_after: float):
        super().__init__(message)
        self.retry_after = retry_after


class RequestStream:
    """Async iterator of one request's :class:`TokenEvent`; the last event has ``finish_reason`` set."""

    def __init__(self, scheduler: Scheduler, request_id: str, prompt_ids: list[int], params: RequestParams, loop):
        self.request_id, self.prompt_ids, self.params = request_id, prompt_ids, params
        self._scheduler, self._loop, self._queue = scheduler, loop, asyncio.Queue()
        self.cancelled = False
        self.finished = False  # set by the engine thread with the last event
        self._ended = False  # set by the reader after the last event
        self.submitted = time.perf_counter()
        self.admitted: float | None = None
        self.first_token: float | None = None
        self.done_at: float | None = None
        self.num_tokens = 0
        self.rounds = 0  # speculative rounds this row took part in
        self.round_tokens = 0  # tokens those rounds produced (accepted drafts + the target's own)
        self.verified = 0  # tokens verified in them (anchor + drafts)

    def cancel(self) -> None:
        """Stop the request (thread-safe): it leaves the batch before the next round."""
        self._scheduler._cancel(self)

    @property
    def metrics(self) -> dict:
        end = self.done_at or time.perf_counter()
        return {
            "queue_wait_s": None if self.admitted is None else self.admitted - self.submitted,
            "ttft_s": None if self.first_token is None else self.first_token - self.submitted,
            "latency_s": end - self.submitted,
            "num_tokens": self.num_tokens,
            "rounds": self.rounds,
            "mean_accepted_length": self.round_tokens / self.rounds if self.rounds else None,
            "verified_per_token": self.verified / self.round_tokens if self.round_tokens else None,
        }

    def _push(self, event: TokenEvent) -> None:  # engine thread
        if event.token_ids and self.first_token is None:
            self.first_token = time.perf_counter()
        self.num_tokens += len(event.token_ids)
        if event.finish_reason is not None:
            self.finished, self.done_at = True, time.perf_counter()
        try:
            self._loop.call_soon_threadsafe(self._queue.put_nowait, event)
        except RuntimeError:  # the caller's loop is closed: nobody is listening any more
            pass

    def __aiter__(self):
        return self

    async def __anext__(self) -> TokenEvent:
        if self._ended:
            raise StopAsyncIteration
        event = await self._queue.get()
        self._ended = event.finish_reason is not None
        return event

    async def collect(self) -> tuple[list[int], str]:
        """Wait for the whole request: (tokens, finish_reason)."""
        tokens, reason = [], None
        async for event in self:
            tokens.extend(event.token_ids)
            if event.finish_reason is not None:
                reason = event.finish_reason
                break
        return tokens, reason


class Scheduler:
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

    def __init__(self, target, drafter, tokenizer, config: SchedulerConfig | None = None, *,
                 drafting: DraftingConfig | None = None, drafting_state: DraftingState | None = None,
                 verify_policy=None, model_name: str = "adaflash", max_context: int | None = None,
                 generator: torch.Generator | None = None, opd=None):
        self.target, self.drafter, self.tokenizer = target, drafter, tokenizer
        self.opd = opd  # an AdaFlashOPD: records rounds and swaps adapters between them; started and stopped with the engine
        self.config = config or SchedulerConfig()
        self.model_name = model_name
        self.max_context = max_context or int(getattr(target.config, "max_position_embeddings", 0) or 2048)
        self.vocab_size = target.get_output_embeddings().weight.shape[0]
        eos = target.generation_config.eos_token_id
        self.default_stop_ids = frozenset() if eos is None else frozenset(torch.tensor(eos).flatten().tolist())
        self.drafting_state = drafting_state or DraftingState(drafting)
        self.batch = SpeculativeBatch(target, drafter, drafting=drafting, drafting_state=self.drafting_state,
                                      verify_policy=verify_policy, generator=generator, on_round=self._on_round,
                                      observer=None if opd is None else opd.observer)
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
        self.counters = {"submitted": 0, "finished": 0, "cancelled": 0, "errors": 0, "rejected_queue_full": 0,
                         "rounds": 0, "row_rounds": 0, "generated_tokens": 0, "round_tokens": 0, "verified_tokens": 0}
        self.source_counts: dict[str, int] = {}
        self.mean_latency: float | None = None  # EMA of finished requests' latency, for Retry-After
        self.last_error: str | None = None

    # ----------------------------------------------------------------------------------------------
    # caller side (any thread with an asyncio loop)
    def start(self) -> None:
        """Start the engine in a background thread (it profiles the verify cost first: seconds to a minute).

        On a CPU with few cores prefer :meth:`run` in the thread that loaded the models: libgomp slows
        every OpenMP region once two OS threads own thread teams, and a background engine next to a
        main thread that ran torch work decodes at about half speed (``results/session10/worker_thread.py``).
        """
        with self._lock:
            if self._running:
                return
            self._running = True
            self._stopped.clear()
        self._thread = threading.Thread(target=self._engine, name="adaflash-engine", daemon=True)
        self._thread.start()

    def run(self) -> None:
        """Run the engine in the calling thread until :meth:`stop` is called from another thread
        (or a signal raises ``KeyboardInterrupt`` here). ``adaflash serve`` runs it in the main thread,
        with the HTTP server in a background thread, so that one OS thread does all torch work."""
        with self._lock:
            if self._running:
                raise RuntimeError("the scheduler is already running: call stop() first.")
            self._running = True
            self._stopped.clear()
        self._thread = threading.current_thread()
        try:
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
        counts = [n for n in (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024) if n <= max(self.config.max_batch_size * longest, 16)]
        try:
            start = time.perf_counter()
            self.drafting_state.cost_model.calibrate(self.target, counts)
            rows = [n for n in (2, 4, 8, 16, 32, 64, 128) if n <= self.config.max_batch_size] + [self.config.max_batch_size]
            widths = tuple(w for w in (1, 2, 3, 5, 9, 17) if w <= longest) if wants_drafts(self.batch.policy, 2) else (1,)
            self.drafting_state.cost_model.calibrate_rows(self.target, sorted(set(r for r in rows if r > 1)), widths=widths)
            logger.info("verify cost profiled for %s tokens and %s rows x %s tokens in %.1fs", counts, rows, widths,
                        time.perf_counter() - start)
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

    def submit(self, prompt_ids: list[int], params: RequestParams) -> RequestStream:
        """Queue a request; call from a running asyncio loop. Raises ValueError or :class:`QueueFull`."""
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
                f"context of {self.max_context} tokens: shorten the prompt or lower max_tokens.")
        if not self._running:
            raise RuntimeError("the scheduler is not running: call start() or run() first.")
        with self._lock:
            if len(self._queue) >= self.config.max_queue:
                self.counters["rejected_queue_full"] += 1
                raise QueueFull(f"the queue is full ({self.config.max_queue} requests waiting); retry later.",
                                retry_after=self._retry_after())
            stream = RequestStream(self, f"req-{next(self._ids)}", prompt_ids, params, loop)
            self._queue.append(stream)
            self.counters["submitted"] += 1
            self._lock.notify_all()
        return stream

    def status(self) -> dict:
        with self._lock:
            c = dict(self.counters)
            return {
                "running": self._running,
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
                    if self.opd is not None and self.opd.inline and self.opd.wants_idle_time():
                        idle_training = True  # no requests: the inline OPD trainer gets the engine's thread
                        break
                    self._lock.wait()
                if not self._running:
                    break
                cancelled, self._cancelled = self._cancelled, set()
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
                if admitted:
                    self._deliver(self.batch.add_rows([
                        RowSpec(s.request_id, s.prompt_ids, s.params.max_new_tokens, s.params.sampling(),
                                frozenset(s.params.stop_token_ids) or self.default_stop_ids) for s in admitted]))
                if len(self.batch):
                    self._deliver(self.batch.step())
                    if self.opd is not None:
                        self.opd.check_health()  # restarts a dead trainer (bounded; a thread liveness check); serving never waits on it
                ended = self.counters["finished"] + self.counters["cancelled"] + self.counters["errors"]
                if ended != self._trimmed_at_finished and self._heap.maybe_trim():
                    self._trimmed_at_finished = ended
            except Exception as error:  # a failed round ends its requests, never the server
                logger.exception("engine round failed")
                self._fail_all(f"{type(error).__name__}: {error}")

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

    def _drop(self, cancelled: set[str]) -> None:
        ids = [i for i in cancelled if i in self._active]
        if not ids:
            return
        self.batch.drop_rows(ids)
        for request_id in ids:
            self._finish(request_id, TokenEvent([], "cancelled"))

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
            key = {"cancelled": "cancelled", "error": "errors"}.get(event.finish_reason, "finished")
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
        for row, accepted, verified, source in zip(stats.rows, stats.accept_lengths, stats.verify_lens, stats.sources):
            c["row_rounds"] += 1
            c["round_tokens"] += accepted + 1
            c["verified_tokens"] += verified
            self.source_counts[source] = self.source_counts.get(source, 0) + 1
            stream = self._active.get(row)
            if stream is not None:
                stream.rounds += 1
                stream.round_tokens += accepted + 1
                stream.verified += verified
