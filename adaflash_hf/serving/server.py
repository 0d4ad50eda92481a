"""``adaflash serve``: an OpenAI-compatible HTTP server over the continuous-batching scheduler.

Endpoints: ``GET /v1/models``, ``POST /v1/completions``, ``POST /v1/chat/completions`` (both with
``stream: true`` as server-sent events), ``GET /health`` and ``GET /v1/status`` (the scheduler's
counters). This module turns requests into token prompts and `RequestParams`, and token events back
into text: incremental UTF-8-safe detokenization, ``stop`` strings, OpenAI-shaped errors. The
scheduler owns batching, admission and the per-request checks that raise ``ValueError``.

Output length: an explicit ``max_tokens`` (``max_completion_tokens`` in chat) that does not fit in the
context beside the prompt is rejected with HTTP 400; when omitted it defaults to 16 for completions
(as OpenAI) and to the rest of the context for chat, clamped to the room left in the context.

fastapi, uvicorn, pydantic and torch are imported inside functions, so the CLI reads ``ServeArgs``
without the serve extra installed.
"""

import asyncio
import json
import logging
import math
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from ..cli_args import DTYPES, check_choice, check_port_free, dtype_field
from ..targets import DEFAULT_TARGET, PRESETS

logger = logging.getLogger(__name__)

COMPLETION_DEFAULT_MAX_TOKENS = 16  # OpenAI's default for /v1/completions


@dataclass
class ServeArgs:
    target: str = field(default=DEFAULT_TARGET, metadata={"help": f"Preset ({', '.join(PRESETS)}), local folder, .gguf file or Hub id."})
    drafter: str = field(default="auto", metadata={"help": "'auto' (bundled drafter for the preset), 'fresh' (untrained), a folder or a Hub id."})
    host: str = field(default="127.0.0.1", metadata={"help": "Address to bind: 127.0.0.1 serves this machine only; 0.0.0.0 exposes the server, which has no authentication, to the network."})
    port: int = field(default=8000, metadata={"help": "TCP port."})
    dtype: str = dtype_field()
    max_batch_size: int = field(default=32, metadata={"help": "Most requests decoding at once."})
    max_queue: int = field(default=256, metadata={"help": "Most requests waiting; past it, new ones get HTTP 429 with a Retry-After header."})
    verify_len: int | None = field(default=None, metadata={"help": "Tokens the target verifies per round (anchor + drafts); default: chosen per round for the most expected tokens per second at the current load."})
    sources: str = field(default="drafter,suffix,global,datastore", metadata={"help": "Draft sources the engine may choose from each round (comma-separated subset of drafter, suffix, global, datastore)."})
    tree_nodes: int | None = field(default=None, metadata={"help": "Most draft tokens a row verifies per round as a draft tree of its candidates; 0 verifies the single best candidate; default: the library's (DraftingConfig.tree_nodes)."})
    length_head: str = field(default="auto", metadata={"help": "Adaptive length head that informs the verify-length policy: 'auto' (the one bundled beside the drafter, if any), 'none', a folder or a Hub id."})
    served_model_name: str | None = field(default=None, metadata={"help": "Model id that clients send and /v1/models lists (default: --target)."})
    opd: bool = field(default=False, metadata={"help": "On-policy distillation: train LoRA adapters on the drafter from live traffic (on a CPU between rounds, under --opd-duty-cycle, and while idle) and swap them in between rounds (status under /v1/status)."})
    opd_publish_dir: str | None = field(default=None, metadata={"help": "With --opd: also write each adapter version to this folder (v000N/ + LATEST) for other engines to follow."})
    opd_duty_cycle: float = field(default=0.25, metadata={"help": "With --opd: share of wall time the trainer may compute; serving keeps the rest."})

    def __post_init__(self):
        if not 0 < self.port < 65536:
            raise ValueError(f"--port {self.port}: choose a TCP port in 1..65535.")
        if self.verify_len is not None and self.verify_len < 1:
            raise ValueError(f"--verify-len {self.verify_len}: must be >= 1 (omit it for the adaptive policy).")
        check_choice("--dtype", self.dtype, DTYPES)
        self.drafting()  # validates --sources
        if not 0 < self.opd_duty_cycle <= 1:
            raise ValueError(f"--opd-duty-cycle {self.opd_duty_cycle}: must be in (0, 1].")
        if (self.opd_publish_dir or self.opd_duty_cycle != 0.25) and not self.opd:
            raise ValueError("--opd-publish-dir and --opd-duty-cycle need --opd.")

    def drafting(self):
        from ..decoding.config import DraftingConfig

        return DraftingConfig.from_sources(self.sources, self.tree_nodes)


def build_scheduler(args: ServeArgs):
    """Load the target and drafter and wrap them in a (not yet started) `Scheduler`."""
    from ..checks import check_verify_len
    from ..decoding.policy import FixedVerifyLength
    from ..drafters import load_drafter
    from ..targets import load_target
    from .scheduler import Scheduler, SchedulerConfig

    config = SchedulerConfig(max_batch_size=args.max_batch_size, max_queue=args.max_queue)  # validates both
    target, tokenizer = load_target(args.target, dtype=args.dtype)
    drafter = load_drafter(args.drafter, target, target_name=args.target)
    drafting = args.drafting()
    if args.verify_len is not None:
        check_verify_len(args.verify_len, drafter, drafting)
    policy = FixedVerifyLength(args.verify_len) if args.verify_len else adaptive_policy(drafter, args.length_head, args.target)
    opd = None
    if args.opd:
        if drafter is None:
            raise ValueError("--opd trains the drafter, but --drafter is none: pass a drafter (or 'auto').")
        from ..online import AdaFlashOPD, OPDConfig

        opd = AdaFlashOPD(target, drafter, OPDConfig(duty_cycle=args.opd_duty_cycle, publish_dir=args.opd_publish_dir),
                          base_drafter_name=args.drafter)
    return Scheduler(target, drafter, tokenizer, config, drafting=drafting, verify_policy=policy,
                     model_name=args.served_model_name or args.target, opd=opd)


def adaptive_policy(drafter, length_head: str = "auto", target_name: str | None = None):
    """The default verify-length policy: goodput with the length head's acceptance estimates when one is
    available ('auto': bundled beside the drafter), plain goodput otherwise (None: the engine's default)."""
    if drafter is None or length_head == "none":
        return None
    from ..decoding.policy import LengthHeadVerifyLength
    from ..training.length_head import load_length_head

    try:
        head = load_length_head(length_head, drafter, target_name=target_name)
    except ValueError:
        if length_head != "auto":
            raise
        logger.info("no bundled length head for %s: verify lengths from the acceptance estimator alone", target_name)
        return None
    return LengthHeadVerifyLength(head)


def run_serve(args: ServeArgs) -> int:
    """Serve until interrupted (Ctrl-C or SIGTERM).

    The engine runs in the main thread, the thread that loaded the models, and uvicorn in a background
    thread: one OS thread does all torch work, which on a few-core CPU decodes about twice as fast as an
    engine thread beside a main thread that ran torch (libgomp; ``results/session11/served_thread.py``)."""
    import signal

    try:
        import uvicorn  # noqa: F401
    except ImportError as error:
        raise SystemExit(f"error: adaflash serve needs the serve extra: pip install 'adaflash-hf[serve]' ({error}).") from None
    check_port_free(args.host, args.port)  # before minutes of loading
    scheduler = build_scheduler(args)
    scheduler.calibrate()  # here, before the port opens: no request waits behind the verify-cost profile
    server = ServerThread(create_app(scheduler, manage_scheduler=False), host=args.host, port=args.port, log_level="info")
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # SIGTERM stops like Ctrl-C: requests end "cancelled"
    try:
        with server:
            logger.info("serving %r (context %d tokens) on http://%s:%d/v1", scheduler.model_name, scheduler.max_context,
                        args.host, server.port)
            scheduler.run()
    except KeyboardInterrupt:
        logger.info("stopping")
    finally:
        scheduler.stop()
    return 0


# --------------------------------------------------------------------------------------------------
# Text: incremental detokenization and stop strings (pure, no web imports)


class IncrementalDetokenizer:
    """Text deltas of a growing token list that join to ``decode(all tokens, skip_special_tokens=True)``.

    Each step decodes only a window, from the last emitted token to the end, and emits what it adds
    beyond the window's already-emitted head (the "decode prefix, emit the delta" scheme of TGI and
    vLLM); the head keeps word-boundary spaces right. Text ending in U+FFFD is an incomplete UTF-8
    character (its bytes split across tokens) and waits for the next tokens; `flush` emits whatever
    is left at the end.
    """

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.token_ids: list[int] = []
        self.prefix_offset = 0  # window start
        self.read_offset = 0  # tokens before this are emitted

    def add(self, token_ids: list[int]) -> str:
        self.token_ids.extend(token_ids)
        return self._delta(final=False)

    def flush(self) -> str:
        return self._delta(final=True)

    def _delta(self, final: bool) -> str:
        if self.read_offset == len(self.token_ids):
            return ""
        head = self._decode(self.prefix_offset, self.read_offset)
        text = self._decode(self.prefix_offset, len(self.token_ids))
        if not final and (len(text) <= len(head) or text.endswith("\ufffd")):
            return ""
        self.prefix_offset, self.read_offset = self.read_offset, len(self.token_ids)
        return text[len(head):]

    def _decode(self, start: int, end: int) -> str:
        return self.tokenizer.decode(self.token_ids[start:end], skip_special_tokens=True)


def find_stop(text: str, stop: list[str]) -> int | None:
    """Index of the earliest stop string in ``text``, or None."""
    hits = [i for s in stop if (i := text.find(s)) >= 0]
    return min(hits) if hits else None


def partial_stop_length(text: str, stop: list[str]) -> int:
    """Length of the longest end of ``text`` that begins some stop string (held back while streaming)."""
    return max((k for s in stop for k in range(1, len(s)) if text.endswith(s[:k])), default=0)


class RequestError(Exception):
    """An error for the client, sent as OpenAI's ``{"error": {message, type, param, code}}``."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 type: str = "invalid_request_error", headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.type = status, message, param, code, type
        self.headers = headers

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def validation_error(errors) -> RequestError:
    """Pydantic/FastAPI validation errors as one 400 that names the offending field."""
    first = errors[0]
    loc = [part for part in first["loc"] if part != "body"]
    if first["type"] == "json_invalid":
        return RequestError(400, f"the request body is not valid JSON: {first['ctx']['error']} (at character "
                                 f"{loc[0] if loc else 0}).")
    param = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in loc).lstrip(".") or None
    if first["type"] == "extra_forbidden":
        return RequestError(400, f"Unrecognized request argument supplied: {param}", param=param)
    if param is None and first["type"] != "value_error":  # empty body, or JSON that is not an object
        return RequestError(400, "the request body must be a JSON object.")
    message = "missing required argument" if first["type"] == "missing" else first["msg"].removeprefix("Value error, ")
    return RequestError(400, f"{param}: {message}" if param else message, param=param)


class Generation:
    """One submitted request seen as text: `deltas` yields its output with stop strings applied."""

    def __init__(self, stream, tokenizer, prompt_tokens: int, stop: list[str]):
        self.stream, self.prompt_tokens, self.stop = stream, prompt_tokens, stop
        self.detokenizer = IncrementalDetokenizer(tokenizer)
        self.completion_tokens = 0
        self.finish_reason: str | None = None  # "stop" or "length" once done
        self._ended = False  # the scheduler sent its last event

    @property
    def usage(self) -> dict:
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                "total_tokens": self.prompt_tokens + self.completion_tokens}

    async def deltas(self) -> AsyncIterator[str]:
        """Text pieces; raises `RequestError` when the engine fails or drops the request.

        A matched stop string ends the output (without it) and cancels the request; text that could
        be the start of a stop string is held back until the next tokens settle it. Leaving early
        (client disconnect, error) cancels the request too, so its batch row is freed.
        """
        held = ""
        try:
            async for event in self.stream:
                self.completion_tokens += len(event.token_ids)
                self._ended = event.finish_reason is not None
                if event.finish_reason == "error":
                    raise RequestError(500, f"generation failed: {event.error}", type="server_error")
                if event.finish_reason == "cancelled":
                    raise RequestError(503, "the server cancelled this request (it is shutting down); retry later.",
                                       type="server_error")
                text = held + self.detokenizer.add(event.token_ids)
                if self._ended:
                    text += self.detokenizer.flush()
                cut = find_stop(text, self.stop)
                if cut is not None:
                    self.finish_reason = "stop"
                    if cut:
                        yield text[:cut]
                    return
                if self._ended:
                    self.finish_reason = event.finish_reason
                    if text:
                        yield text
                    return
                keep = partial_stop_length(text, self.stop)
                held, text = text[len(text) - keep:], text[:len(text) - keep]
                if text:
                    yield text
            raise RequestError(500, "the scheduler's stream ended without a finish reason.", type="server_error")
        finally:
            if not self._ended:
                self.stream.cancel()

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


# --------------------------------------------------------------------------------------------------
# The app


def create_app(scheduler, manage_scheduler: bool = True):
    """A FastAPI app serving ``scheduler``. With ``manage_scheduler`` its lifespan starts the engine in a
    background thread and stops it; without, whoever made the app runs the engine (``scheduler.run()``)."""
    from contextlib import asynccontextmanager

    from fastapi import FastAPI, Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse, StreamingResponse
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
    from .scheduler import QueueFull, RequestParams

    tokenizer = scheduler.tokenizer
    started = int(time.time())

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

    # -- errors: always OpenAI's shape ------------------------------------------------------------
    def error_response(error: RequestError) -> JSONResponse:
        return JSONResponse(error.body(), status_code=error.status, headers=error.headers)

    @app.exception_handler(RequestError)
    async def _request_error(request, error: RequestError):
        return error_response(error)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request, error: RequestValidationError):
        return error_response(validation_error(error.errors()))

    @app.exception_handler(HTTPException)
    async def _http_error(request, error: HTTPException):
        return error_response(RequestError(error.status_code, str(error.detail), headers=error.headers))

    @app.exception_handler(Exception)
    async def _internal_error(request, error: Exception):  # logged with its traceback by Starlette
        return error_response(RequestError(500, f"internal error: {type(error).__name__}: {error}", type="server_error"))

    # -- shared request handling --------------------------------------------------------------------
    def submit(body, prompt_ids: list[int], default_max_tokens: int | None) -> Generation:
        if body.model != scheduler.model_name:
            raise RequestError(404, f"The model {body.model!r} does not exist: this server serves "
                                    f"{scheduler.model_name!r} (GET /v1/models).", param="model", code="model_not_found")
        room = scheduler.max_context - len(prompt_ids)
        if room < 1:
            raise RequestError(400, f"the prompt has {len(prompt_ids)} tokens, which leaves no room in this model's "
                                    f"context of {scheduler.max_context} tokens: shorten the prompt.",
                               code="context_length_exceeded")
        max_new_tokens = body.requested_max_tokens or min(default_max_tokens or room, room)
        try:
            params = RequestParams(max_new_tokens=max_new_tokens, temperature=body.temperature, top_p=body.top_p,
                                   top_k=body.top_k, seed=body.seed)
            stream = scheduler.submit(prompt_ids, params)
        except QueueFull as error:
            raise RequestError(429, str(error), type="rate_limit_error", code="queue_full",
                               headers={"Retry-After": str(max(1, math.ceil(error.retry_after)))}) from None
        except ValueError as error:
            raise RequestError(400, str(error)) from None
        return Generation(stream, tokenizer, len(prompt_ids), body.stop_strings)

    def sse(chunk, include_usage: bool) -> str:
        exclude = ({"adaflash"} if chunk.adaflash is None else set()) | (set() if include_usage else {"usage"})
        return f"data: {chunk.model_dump_json(exclude=exclude)}\n\n"

    def sse_error(error: RequestError) -> str:
        return f"data: {json.dumps(error.body())}\n\n"

    def event_stream(chunks: AsyncIterator[str]) -> StreamingResponse:
        return StreamingResponse(chunks, media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    # -- endpoints ----------------------------------------------------------------------------------
    @app.get("/health")
    async def health():
        """200 while the engine takes requests; 503 while it starts up (profiling costs) or after it stopped,
        so that a load balancer or an orchestrator's readiness probe waits for it."""
        if scheduler.ready:
            return {"status": "ok"}
        return JSONResponse({"status": "unavailable", "detail": "the engine is not taking requests yet (starting up) or any more "
                             "(stopped); retry shortly"}, status_code=503, headers={"Retry-After": "1"})

    @app.get("/v1/status")
    async def status() -> dict:
        return scheduler.status()

    @app.get("/v1/models")
    async def models() -> ModelList:
        return ModelList(data=[ModelCard(id=scheduler.model_name, created=started, max_model_len=scheduler.max_context)])

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
            return CompletionResponse(id=rid, created=created, model=scheduler.model_name, usage=usage, adaflash=adaflash,
                                      choices=[CompletionChoice(text=text, finish_reason=finish_reason)] if choices else [])

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
            raise RequestError(400, f"the model's chat template rejected these messages: {error}", param="messages") from None
        generation = submit(body, prompt_ids, None)
        rid, created = f"chatcmpl-{generation.stream.request_id}", int(time.time())

        if not body.stream:
            text = await generation.text(request)
            return ChatCompletionResponse(
                id=rid, created=created, model=scheduler.model_name, usage=generation.usage, adaflash=generation.metrics,
                choices=[ChatChoice(message=AssistantMessage(content=text), finish_reason=generation.finish_reason)])

        def chunk(delta: DeltaMessage | None, finish_reason=None, adaflash=None, usage=None) -> ChatCompletionChunk:
            choices = [] if delta is None else [ChatChunkChoice(delta=delta, finish_reason=finish_reason)]
            return ChatCompletionChunk(id=rid, created=created, model=scheduler.model_name, choices=choices,
                                       usage=usage, adaflash=adaflash)

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


class ServerThread:
    """uvicorn serving ``app`` in a background thread (port 0: a free one); ``with`` gives its base URL."""

    def __init__(self, app, host: str = "127.0.0.1", port: int = 0, log_level: str = "warning"):
        import uvicorn

        self.host = host
        self.server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level=log_level))
        self.thread = threading.Thread(target=self.server.run, name="adaflash-http", daemon=True)
        self.port: int | None = None

    def __enter__(self) -> str:
        self.thread.start()
        deadline = time.time() + 30
        while not self.server.started:
            if not self.thread.is_alive():  # uvicorn logs why (a port in use, say) and exits its thread
                raise RuntimeError(f"the HTTP server did not start on {self.host}; see the log above.")
            if time.time() > deadline:
                raise RuntimeError("the HTTP server did not start within 30 s.")
            time.sleep(0.02)
        self.port = self.server.servers[0].sockets[0].getsockname()[1]
        host = "127.0.0.1" if self.host in ("0.0.0.0", "::") else self.host
        return f"http://{host}:{self.port}"

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(10)
