"""The FastAPI app of ``adaflash serve``: OpenAI-compatible routes over a continuous-batching scheduler.

Endpoints: ``GET /v1/models``, ``POST /v1/completions``, ``POST /v1/chat/completions`` (both with
``stream: true`` as server-sent events), ``GET /v1/status`` (the scheduler's counters), ``GET /health``
and ``GET /metrics`` (Prometheus, :mod:`.metrics`). This module turns requests into token prompts and
`RequestParams`, and a request's token events into text through :class:`~.generation.Generation`.
The scheduler owns batching, admission and the per-request checks that raise ``ValueError``.

Output length: an explicit ``max_tokens`` (``max_completion_tokens`` in chat) that does not fit in the
context beside the prompt is rejected with HTTP 400; when omitted it defaults to 16 for completions
(as OpenAI) and to the rest of the context for chat, clamped to the room left in the context.

Admission: a full queue is HTTP 429 and a draining server HTTP 503, both with ``Retry-After``. A request's
deadline is its ``timeout`` field or the server's ``request_timeout``, whichever is shorter; past it the
request ends with HTTP 408 (an error event when streaming) and frees its batch row.
"""

import json
import math
import time
from collections.abc import AsyncIterator

from .auth import APIKeyMiddleware
from .generation import Generation, RequestError, validation_error
from .metrics import ServingMetrics

COMPLETION_DEFAULT_MAX_TOKENS = 16  # OpenAI's default for /v1/completions
GENERATION_PATHS = ("/v1/completions", "/v1/chat/completions")


def create_app(
    scheduler, manage_scheduler: bool = True, api_key: str | None = None, request_timeout: float | None = None
):
    """A FastAPI app serving ``scheduler``. With ``manage_scheduler`` its lifespan starts the engine in a
    background thread and stops it; without, whoever made the app runs the engine (``scheduler.run()``).

    ``api_key``: required as ``Authorization: Bearer <key>`` on every ``/v1/*`` route (None: no key).
    ``request_timeout``: seconds a request may take when it sends no ``timeout``, and the most it may ask
    for (None: no server deadline)."""
    from contextlib import asynccontextmanager

    from fastapi import FastAPI, Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse, Response, StreamingResponse
    from jinja2 import TemplateError
    from starlette.exceptions import HTTPException

    from ..prompting import chat_prompt_ids
    from .protocol import (
        AssistantMessage,
        ChatChoice,
        ChatChunkChoice,
        ChatCompletionChunk,
        ChatCompletionRequest,
        ChatCompletionResponse,
        CompletionChoice,
        CompletionRequest,
        CompletionResponse,
        DeltaMessage,
        ModelCard,
        ModelList,
    )
    from .requests import EngineNotRunning, QueueFull, RequestParams, ShuttingDown

    if request_timeout is not None and not request_timeout > 0:
        raise ValueError(f"request_timeout={request_timeout}: must be > 0 seconds (None: no deadline).")
    tokenizer = scheduler.tokenizer
    started = int(time.time())
    metrics = ServingMetrics(scheduler)

    @asynccontextmanager
    async def lifespan(app):
        if not manage_scheduler:
            yield
            return
        scheduler.start()
        try:
            yield
        finally:
            scheduler.stop()

    app = FastAPI(title="adaflash", summary="OpenAI-compatible speculative decoding server", lifespan=lifespan)
    app.state.metrics = metrics
    if api_key is not None:
        app.add_middleware(
            APIKeyMiddleware,
            api_key=api_key,
            on_reject=lambda path: metrics.count_rejection(401) if path in GENERATION_PATHS else None,
        )

    # -- errors: always OpenAI's shape ------------------------------------------------------------
    def error_response(request, error: RequestError) -> JSONResponse:
        if not error.counted and request.url.path in GENERATION_PATHS:
            metrics.count_rejection(error.status)
        return JSONResponse(error.body(), status_code=error.status, headers=error.headers)

    @app.exception_handler(RequestError)
    async def _request_error(request, error: RequestError):
        return error_response(request, error)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request, error: RequestValidationError):
        return error_response(request, validation_error(error.errors()))

    @app.exception_handler(HTTPException)
    async def _http_error(request, error: HTTPException):
        return error_response(request, RequestError(error.status_code, str(error.detail), headers=error.headers))

    @app.exception_handler(Exception)
    async def _internal_error(request, error: Exception):  # logged with its traceback by Starlette
        return error_response(
            request, RequestError(500, f"internal error: {type(error).__name__}: {error}", type="server_error")
        )

    # -- shared request handling --------------------------------------------------------------------
    def submit(body, prompt_ids: list[int], default_max_tokens: int | None) -> Generation:
        if body.model != scheduler.model_name:
            raise RequestError(
                404,
                f"The model {body.model!r} does not exist: this server serves "
                f"{scheduler.model_name!r} (GET /v1/models).",
                param="model",
                code="model_not_found",
            )
        room = scheduler.max_context - len(prompt_ids)
        if room < 1:
            raise RequestError(
                400,
                f"the prompt has {len(prompt_ids)} tokens, which leaves no room in this model's "
                f"context of {scheduler.max_context} tokens: shorten the prompt.",
                code="context_length_exceeded",
            )
        max_new_tokens = body.requested_max_tokens or min(default_max_tokens or room, room)
        timeout = min((t for t in (body.timeout, request_timeout) if t is not None), default=None)
        try:
            params = RequestParams(
                max_new_tokens=max_new_tokens,
                temperature=body.temperature,
                top_p=body.top_p,
                top_k=body.top_k,
                seed=body.seed,
                timeout=timeout,
            )
            stream = scheduler.submit(prompt_ids, params)
        except EngineNotRunning as error:
            raise RequestError(
                503,
                "the engine is not taking requests (it is starting or has stopped); retry shortly or on another "
                "replica.",
                type="server_error",
                code="engine_not_running",
                headers={"Retry-After": str(max(1, math.ceil(error.retry_after)))},
            ) from None
        except ShuttingDown as error:
            raise RequestError(
                503,
                str(error),
                type="server_error",
                code="shutting_down",
                headers={"Retry-After": str(max(1, math.ceil(error.retry_after)))},
            ) from None
        except QueueFull as error:
            raise RequestError(
                429,
                str(error),
                type="rate_limit_error",
                code="queue_full",
                headers={"Retry-After": str(max(1, math.ceil(error.retry_after)))},
            ) from None
        except ValueError as error:
            raise RequestError(400, str(error)) from None
        return Generation(stream, tokenizer, len(prompt_ids), body.stop_strings, metrics)

    def sse(chunk, include_usage: bool) -> str:
        exclude = ({"adaflash"} if chunk.adaflash is None else set()) | (set() if include_usage else {"usage"})
        return f"data: {chunk.model_dump_json(exclude=exclude)}\n\n"

    def sse_error(error: RequestError) -> str:
        return f"data: {json.dumps(error.body())}\n\n"

    def event_stream(chunks: AsyncIterator[str]) -> StreamingResponse:
        return StreamingResponse(
            chunks, media_type="text/event-stream", headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
        )

    # -- endpoints ----------------------------------------------------------------------------------
    @app.get("/health")
    async def health():
        """200 while the engine takes requests; 503 while it starts up (profiling costs), drains or after it
        stopped, so that a load balancer or an orchestrator's readiness probe waits for it or moves on."""
        if scheduler.draining:
            return JSONResponse(
                {
                    "status": "draining",
                    "detail": "the server is shutting down: it finishes the requests it took and admits no new one",
                },
                status_code=503,
                headers={"Retry-After": "5"},
            )
        if scheduler.ready:
            return {"status": "ok"}
        return JSONResponse(
            {
                "status": "unavailable",
                "detail": "the engine is not taking requests yet (starting up) or any more (stopped); retry shortly",
            },
            status_code=503,
            headers={"Retry-After": "1"},
        )

    @app.get("/metrics", include_in_schema=False)
    async def prometheus_metrics():
        """Prometheus text exposition; open without the API key, as /health (vLLM does the same)."""
        content, media_type = metrics.render()
        return Response(content, media_type=media_type)

    @app.get("/v1/status")
    async def status() -> dict:
        return scheduler.status()

    @app.get("/v1/models")
    async def models() -> ModelList:
        return ModelList(
            data=[ModelCard(id=scheduler.model_name, created=started, max_model_len=scheduler.max_context)]
        )

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request) -> CompletionResponse:
        if isinstance(body.prompt, list):
            prompt_ids = body.prompt
        else:
            try:
                prompt_ids = chat_prompt_ids(tokenizer, body.prompt, raw=True)
            except ValueError as error:
                raise RequestError(400, str(error), param="prompt") from None
        generation = submit(body, prompt_ids, COMPLETION_DEFAULT_MAX_TOKENS)
        rid, created = f"cmpl-{generation.stream.request_id}", int(time.time())

        def chunk(text: str, finish_reason=None, adaflash=None, usage=None, choices=True) -> CompletionResponse:
            return CompletionResponse(
                id=rid,
                created=created,
                model=scheduler.model_name,
                usage=usage,
                adaflash=adaflash,
                choices=[CompletionChoice(text=text, finish_reason=finish_reason)] if choices else [],
            )

        if not body.stream:
            text = await generation.text(request)
            return chunk(text, generation.finish_reason, generation.metrics, generation.usage)

        async def chunks() -> AsyncIterator[str]:
            try:
                async for text in generation.deltas():
                    yield sse(chunk(text), body.include_usage)
                yield sse(chunk("", generation.finish_reason, generation.metrics), body.include_usage)
                if body.include_usage:
                    yield sse(chunk("", usage=generation.usage, choices=False), True)
            except RequestError as error:
                yield sse_error(error)
            yield "data: [DONE]\n\n"

        return event_stream(chunks())

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest, request: Request) -> ChatCompletionResponse:
        messages = [{"role": m.role, "content": m.text} for m in body.messages]
        try:
            prompt_ids = chat_prompt_ids(tokenizer, messages)
        except ValueError as error:  # no chat template: use /v1/completions
            raise RequestError(400, f"{error} Use /v1/completions for plain text.", param="messages") from None
        except TemplateError as error:
            raise RequestError(
                400, f"the model's chat template rejected these messages: {error}", param="messages"
            ) from None
        generation = submit(body, prompt_ids, None)
        rid, created = f"chatcmpl-{generation.stream.request_id}", int(time.time())

        if not body.stream:
            text = await generation.text(request)
            return ChatCompletionResponse(
                id=rid,
                created=created,
                model=scheduler.model_name,
                usage=generation.usage,
                adaflash=generation.metrics,
                choices=[ChatChoice(message=AssistantMessage(content=text), finish_reason=generation.finish_reason)],
            )

        def chunk(delta: DeltaMessage | None, finish_reason=None, adaflash=None, usage=None) -> ChatCompletionChunk:
            choices = [] if delta is None else [ChatChunkChoice(delta=delta, finish_reason=finish_reason)]
            return ChatCompletionChunk(
                id=rid, created=created, model=scheduler.model_name, choices=choices, usage=usage, adaflash=adaflash
            )

        async def chunks() -> AsyncIterator[str]:
            try:
                yield sse(chunk(DeltaMessage(role="assistant", content="")), body.include_usage)
                async for text in generation.deltas():
                    yield sse(chunk(DeltaMessage(content=text)), body.include_usage)
                yield sse(chunk(DeltaMessage(), generation.finish_reason, generation.metrics), body.include_usage)
                if body.include_usage:
                    yield sse(chunk(None, usage=generation.usage), True)
            except RequestError as error:
                yield sse_error(error)
            yield "data: [DONE]\n\n"

        return event_stream(chunks())

    return app
