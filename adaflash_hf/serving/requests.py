"""What the serving scheduler takes and gives per request: its config, request parameters, token events,
the admission errors, and the per-request stream that a caller iterates on its asyncio loop.

:class:`RequestStream` lives on two threads: the engine thread pushes events (``_push``), the caller's
asyncio loop reads them; timings are ``time.perf_counter`` seconds.
"""

from __future__ import annotations

import asyncio
import math
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..decoding.sampling import SamplingParams

if TYPE_CHECKING:
    from .scheduler import Scheduler


@dataclass
class SchedulerConfig:
    max_batch_size: int = field(default=32, metadata={"help": "Most requests decoding at once."})
    max_queue: int = field(default=256, metadata={"help": "Most requests waiting; past it, new ones get HTTP 429."})
    max_prefill_tokens: int = field(default=4096, metadata={"help": "Most prompt tokens admitted between two rounds."})
    adaptive_admission: bool = field(
        default=True,
        metadata={
            "help": "Cap the prompt tokens prefilled between two rounds at what the measured cost says takes "
            "prefill_rounds decode rounds (at least one request joins per round), so running requests keep streaming "
            "while new ones join."
        },
    )
    prefill_rounds: float = field(
        default=4.0, metadata={"help": "With adaptive admission: decode rounds' worth of time one admission may take."}
    )
    calibrate: bool = field(
        default=True,
        metadata={
            "help": "Time target forwards of 1 to max_batch_size x (block + 1) tokens at start-up, so verify lengths "
            "and admission know this machine's costs from the first request."
        },
    )

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
    timeout: float | None = None  # seconds from submission; past it the request ends with finish_reason "timeout"

    def __post_init__(self):
        if not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens={self.max_new_tokens!r}: must be an integer >= 1.")
        if self.timeout is not None and not (self.timeout > 0 and math.isfinite(self.timeout)):
            raise ValueError(f"timeout={self.timeout}: must be a number of seconds > 0 (omit it for no deadline).")
        if self.temperature < 0:
            raise ValueError(f"temperature={self.temperature}: must be >= 0 (0 is greedy).")
        if self.top_p is not None and not 0 < self.top_p <= 1:
            raise ValueError(f"top_p={self.top_p}: must be in (0, 1].")
        self.sampling()  # validates top_k

    def sampling(self) -> SamplingParams:
        if self.temperature == 0:
            return SamplingParams()
        return SamplingParams(
            do_sample=True,
            temperature=self.temperature,
            top_k=self.top_k,
            top_p=self.top_p if self.top_p is not None and self.top_p < 1 else None,
        )


@dataclass
class TokenEvent:
    token_ids: list[int]
    finish_reason: str | None = None  # "stop", "length", "cancelled", "timeout" or "error" on the last event
    error: str | None = None


class QueueFull(Exception):
    """The queue holds ``max_queue`` requests: retry after ``retry_after`` seconds (HTTP 429)."""

    def __init__(self, message: str, retry_after: float):
        super().__init__(message)
        self.retry_after = retry_after


class ShuttingDown(QueueFull):
    """The engine is draining before it stops and admits no new request (HTTP 503)."""


class EngineNotRunning(ShuttingDown, RuntimeError):
    """The engine loop is not running (never started, or ended): no request is admitted (HTTP 503)."""


class RequestStream:
    """Async iterator of one request's :class:`TokenEvent`; the last event has ``finish_reason`` set."""

    def __init__(self, scheduler: Scheduler, request_id: str, prompt_ids: list[int], params: RequestParams, loop):
        self.request_id, self.prompt_ids, self.params = request_id, prompt_ids, params
        self._scheduler, self._loop, self._queue = scheduler, loop, asyncio.Queue()
        self.cancelled = False
        self.finished = False  # set by the engine thread with the last event
        self._ended = False  # set by the reader after the last event
        self.submitted = time.perf_counter()
        self.deadline = None if params.timeout is None else self.submitted + params.timeout
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
