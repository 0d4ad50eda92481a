"""A submitted request seen as text, and the errors the server sends.

`Generation` turns a scheduler stream's token events into text deltas (incremental UTF-8-safe
detokenization, ``stop`` strings held back while they may still match) and reports each request's
outcome, tokens and timings to the server's metrics. `RequestError` is an error for the client in
OpenAI's shape; `validation_error` turns pydantic's errors into one. Pure Python: no web imports.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

from ..detokenizer import IncrementalDetokenizer


def find_stop(text: str, stop: list[str]) -> int | None:
    """Index of the earliest stop string in ``text``, or None."""
    hits = [i for s in stop if (i := text.find(s)) >= 0]
    return min(hits) if hits else None


def partial_stop_length(text: str, stop: list[str]) -> int:
    """Length of the longest end of ``text`` that begins some stop string (held back while streaming)."""
    return max((k for s in stop for k in range(1, len(s)) if text.endswith(s[:k])), default=0)


class RequestError(Exception):
    """An error for the client, sent as OpenAI's ``{"error": {message, type, param, code}}``.

    ``counted``: the request's outcome is already in the metrics (a `Generation` counted it).
    """

    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        code: str | None = None,
        type: str = "invalid_request_error",
        headers: dict[str, str] | None = None,
    ):
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.type = status, message, param, code, type
        self.headers = headers
        self.counted = False

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def validation_error(errors) -> RequestError:
    """Pydantic/FastAPI validation errors as one 400 that names the offending field."""
    first = errors[0]
    loc = [part for part in first["loc"] if part != "body"]
    if first["type"] == "json_invalid":
        return RequestError(
            400, f"the request body is not valid JSON: {first['ctx']['error']} (at character {loc[0] if loc else 0})."
        )
    param = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in loc).lstrip(".") or None
    if first["type"] == "extra_forbidden":
        return RequestError(400, f"Unrecognized request argument supplied: {param}", param=param)
    if param is None and first["type"] != "value_error":  # empty body, or JSON that is not an object
        return RequestError(400, "the request body must be a JSON object.")
    message = "missing required argument" if first["type"] == "missing" else first["msg"].removeprefix("Value error, ")
    return RequestError(400, f"{param}: {message}" if param else message, param=param)


class Generation:
    """One submitted request seen as text: `deltas` yields its output with stop strings applied.

    ``metrics`` (a :class:`~.metrics.ServingMetrics`, or None) gets the prompt's tokens now, then the
    output's tokens as they come, and the outcome and timings once the request ends for any reason.
    """

    def __init__(self, stream, tokenizer, prompt_tokens: int, stop: list[str], metrics=None):
        self.stream, self.prompt_tokens, self.stop = stream, prompt_tokens, stop
        self.detokenizer = IncrementalDetokenizer(tokenizer)
        self.completion_tokens = 0
        self.finish_reason: str | None = None  # "stop" or "length" once done
        self._ended = False  # the scheduler sent its last event
        self._metrics = metrics
        self._started = time.perf_counter()
        self._first_token: float | None = None
        if metrics is not None:
            metrics.prompt_tokens.inc(prompt_tokens)

    @property
    def usage(self) -> dict:
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
        }

    async def deltas(self) -> AsyncIterator[str]:
        """Text pieces; raises `RequestError` when the engine fails, drops the request or its deadline passes.

        A matched stop string ends the output (without it) and cancels the request; text that could
        be the start of a stop string is held back until the next tokens settle it. Leaving early
        (client disconnect, error) cancels the request too, so its batch row is freed.
        """
        held = ""
        outcome = "cancelled"  # unless the stream ends otherwise: the client left
        try:
            async for event in self.stream:
                self._count(event.token_ids)
                self._ended = event.finish_reason is not None
                if event.finish_reason in ("error", "cancelled", "timeout"):
                    outcome = event.finish_reason
                    raise self._ended_early(event)
                text = held + self.detokenizer.add(event.token_ids)
                if self._ended:
                    text += self.detokenizer.flush()
                cut = find_stop(text, self.stop)
                if cut is not None:
                    self.finish_reason, outcome = "stop", "success"
                    if cut:
                        yield text[:cut]
                    return
                if self._ended:
                    self.finish_reason, outcome = event.finish_reason, "success"
                    if text:
                        yield text
                    return
                keep = partial_stop_length(text, self.stop)
                held, text = text[len(text) - keep :], text[: len(text) - keep]
                if text:
                    yield text
            outcome = "error"
            raise RequestError(500, "the scheduler's stream ended without a finish reason.", type="server_error")
        except RequestError as error:
            error.counted = True
            raise
        finally:
            if not self._ended:
                self.stream.cancel()
            self._observe(outcome)

    def _ended_early(self, event) -> RequestError:
        if event.finish_reason == "error":
            return RequestError(500, f"generation failed: {event.error}", type="server_error")
        if event.finish_reason == "timeout":
            timeout = self.stream.params.timeout
            return RequestError(
                408,
                f"the request passed its deadline of {timeout:g} s after {self.completion_tokens} "
                "tokens and was stopped: raise 'timeout' (or the server's --request-timeout) or "
                "lower max_tokens.",
                param="timeout",
                code="request_timeout",
                type="timeout_error",
            )
        return RequestError(
            503, "the server cancelled this request (it is shutting down); retry later.", type="server_error"
        )

    def _count(self, token_ids: list[int]) -> None:
        self.completion_tokens += len(token_ids)
        if token_ids and self._first_token is None:
            self._first_token = time.perf_counter()
        if self._metrics is not None and token_ids:
            self._metrics.generated_tokens.inc(len(token_ids))

    def _observe(self, outcome: str) -> None:
        if self._metrics is None:
            return
        end = time.perf_counter()
        self._metrics.requests.labels(outcome).inc()
        self._metrics.latency.observe(end - self._started)
        if self._first_token is not None:
            self._metrics.ttft.observe(self._first_token - self._started)
            if self.completion_tokens > 1:
                self._metrics.tpot.observe((end - self._first_token) / (self.completion_tokens - 1))

    async def text(self, request) -> str:
        """The whole output; cancels the request if the client disconnects while waiting."""
        watcher = asyncio.create_task(_cancel_on_disconnect(request, self.stream))
        try:
            return "".join([piece async for piece in self.deltas()])
        finally:
            watcher.cancel()

    @property
    def metrics(self) -> dict:
        return dict(self.stream.metrics)


async def _cancel_on_disconnect(request, stream) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass
    stream.cancel()
