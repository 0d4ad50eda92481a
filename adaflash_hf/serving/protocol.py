"""The OpenAI-compatible wire format: request bodies, responses, stream chunks and errors.

Requests are strict: unknown fields are rejected (``extra="forbid"``) and JSON types are not coerced
(``"max_tokens": "10"`` is an error), so a typo never silently changes what is generated. OpenAI
fields this server cannot honour (``n`` > 1, ``logprobs``, penalties) are accepted only at their no-op values
and otherwise rejected with a message that says so. ``top_k`` is an extension, as in vLLM; so is
``timeout`` (seconds before the server ends the request).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_serializer, model_validator

MAX_STOP_STRINGS = 4  # OpenAI's limit


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class StreamOptions(_Strict):
    include_usage: bool = False


class _SamplingRequest(_Strict):
    """Fields shared by /v1/completions and /v1/chat/completions."""

    model: str
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: int | None = Field(default=None, ge=1)
    seed: int | None = None
    n: int = 1
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None  # accepted for compatibility; not used
    timeout: float | None = Field(default=None, gt=0.0)  # extension: seconds before the server ends the request

    @field_validator("n")
    @classmethod
    def _one_choice(cls, n: int) -> int:
        if n != 1:
            raise ValueError(
                f"n={n} is not supported: this server returns one choice per request; send {n} requests instead."
            )
        return n

    @field_validator("presence_penalty", "frequency_penalty")
    @classmethod
    def _no_penalty(cls, penalty: float, info) -> float:
        if penalty != 0:
            raise ValueError(
                f"{info.field_name} is not supported by this server (decoding is lossless); omit it or send 0."
            )
        return penalty

    @field_validator("stop", mode="before")
    @classmethod
    def _stop_strings(cls, stop: Any) -> Any:
        stops = [stop] if isinstance(stop, str) else stop
        if stops is None:
            return None
        if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
            raise ValueError("stop must be a string or a list of strings.")
        if len(stops) > MAX_STOP_STRINGS or not all(stops):
            raise ValueError(f"stop takes at most {MAX_STOP_STRINGS} non-empty strings, got {stops!r}.")
        return stops

    @model_validator(mode="after")
    def _stream_options_need_stream(self):
        if self.stream_options is not None and not self.stream:
            raise ValueError("stream_options is only allowed when stream is true.")
        return self

    @property
    def stop_strings(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage

    @property
    def requested_max_tokens(self) -> int | None:
        return self.max_tokens


class CompletionRequest(_SamplingRequest):
    """``POST /v1/completions``. ``max_tokens`` defaults to 16 (OpenAI's default), clamped to the context."""

    prompt: str | list[int]
    logprobs: int | None = None

    @field_validator("prompt", mode="before")
    @classmethod
    def _one_prompt(cls, prompt: Any) -> Any:
        if isinstance(prompt, list) and prompt and all(isinstance(p, str | list) for p in prompt):
            raise ValueError("batched prompts are not supported: send one request per prompt.")
        if not (isinstance(prompt, str) or isinstance(prompt, list) and all(type(t) is int for t in prompt)):
            raise ValueError("prompt must be a string or a list of token ids.")
        return prompt

    @field_validator("logprobs")
    @classmethod
    def _no_logprobs(cls, logprobs: int | None) -> None:
        if logprobs is not None:
            raise ValueError("logprobs is not supported by this server; omit it.")
        return None


class TextPart(_Strict):
    type: Literal["text"]
    text: str


class ChatMessage(_Strict):
    role: Literal["system", "user", "assistant"]
    content: str | list[TextPart]

    @field_validator("content", mode="before")
    @classmethod
    def _text_content(cls, content: Any) -> Any:
        if isinstance(content, list) and any(not isinstance(p, dict) or p.get("type") != "text" for p in content):
            raise ValueError("only text content parts ({'type': 'text', 'text': ...}) are supported.")
        if not isinstance(content, str | list):
            raise ValueError("content must be a string or a list of text parts.")
        return content

    @property
    def text(self) -> str:
        return self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)


class ChatCompletionRequest(_SamplingRequest):
    """``POST /v1/chat/completions``. ``max_completion_tokens`` (or the older ``max_tokens``) defaults to
    the rest of the context."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = None

    @field_validator("logprobs")
    @classmethod
    def _no_logprobs(cls, logprobs: bool) -> bool:
        if logprobs:
            raise ValueError("logprobs is not supported by this server; omit it.")
        return logprobs

    @field_validator("top_logprobs")
    @classmethod
    def _no_top_logprobs(cls, top_logprobs: int | None) -> None:
        if top_logprobs is not None:
            raise ValueError("top_logprobs is not supported by this server; omit it.")
        return None

    @property
    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens


# Responses. ``adaflash`` carries the engine's per-request metrics (tau, ttft_s, queue_wait_s, ...).


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class CompletionChoice(BaseModel):
    index: int = 0
    text: str
    logprobs: None = None
    finish_reason: Literal["stop", "length"] | None


class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None
    adaflash: dict[str, Any] | None = None


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str


class ChatChoice(BaseModel):
    index: int = 0
    message: AssistantMessage
    logprobs: None = None
    finish_reason: Literal["stop", "length"]


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage
    adaflash: dict[str, Any]


class DeltaMessage(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None

    @model_serializer(mode="wrap")
    def _drop_unset(self, handler) -> dict:  # OpenAI sends {"content": "..."} and a final {}
        return {k: v for k, v in handler(self).items() if v is not None}


class ChatChunkChoice(BaseModel):
    index: int = 0
    delta: DeltaMessage
    logprobs: None = None
    finish_reason: Literal["stop", "length"] | None = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None
    adaflash: dict[str, Any] | None = None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "adaflash"
    max_model_len: int


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class ErrorInfo(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    error: ErrorInfo
