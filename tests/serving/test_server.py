"""The OpenAI-compatible server, driven by the official ``openai`` client (and httpx for what that
client cannot send) against a real uvicorn server on a free localhost port, with `FakeScheduler`.
"""

from __future__ import annotations

import ast
import asyncio
import json
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

fastapi = pytest.importorskip("fastapi", reason="needs the serve extra: pip install -e '.[serve,dev]'")
httpx = pytest.importorskip("httpx")
openai = pytest.importorskip("openai")
uvicorn = pytest.importorskip("uvicorn")

from fake_scheduler import REPLY, FakeScheduler, tiny_chat_tokenizer  # noqa: E402

from adaflash_hf.detokenizer import IncrementalDetokenizer  # noqa: E402
from adaflash_hf.serve import ServeArgs  # noqa: E402
from adaflash_hf.serving.app import create_app  # noqa: E402
from adaflash_hf.serving.generation import find_stop, partial_stop_length  # noqa: E402
from adaflash_hf.serving.server import ServerThread  # noqa: E402

MODEL = "fake-model"


@dataclass
class Served:
    url: str
    scheduler: FakeScheduler

    def client(self, **kwargs) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key="unused", max_retries=0, **kwargs)

    def post(self, path: str, **kwargs) -> httpx.Response:
        return httpx.post(f"{self.url}{path}", timeout=10, **kwargs)


@pytest.fixture(scope="module")
def served():
    scheduler = FakeScheduler(tiny_chat_tokenizer(), model_name=MODEL, max_context=128)
    with ServerThread(create_app(scheduler)) as url:
        assert scheduler.running, "the app's lifespan starts the scheduler"
        yield Served(url, scheduler)
    assert not scheduler.running, "the app's lifespan stops the scheduler"


@pytest.fixture(autouse=True)
def well_behaved(request):
    if "served" in request.fixturenames:
        request.getfixturevalue("served").scheduler.reset()


def wait_for(condition, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def assert_still_serving(served: Served) -> None:
    served.scheduler.reset()
    out = served.client().completions.create(model=MODEL, prompt="Hi", max_tokens=100, temperature=0)
    assert out.choices[0].text == REPLY


# --------------------------------------------------------------------------------------------------
# text handling (pure)


def test_reply_splits_characters_across_tokens():
    """The fixture must exercise the detokenizer: some reply tokens are parts of a character."""
    tokenizer = tiny_chat_tokenizer()
    pieces = [tokenizer.decode([t]) for t in tokenizer.encode(REPLY, add_special_tokens=False)]
    assert any("\ufffd" in p for p in pieces)


@pytest.mark.parametrize("chunk", [1, 2, 5])
def test_incremental_detokenizer_joins_to_full_decode(chunk):
    tokenizer = tiny_chat_tokenizer()
    ids = tokenizer.encode(REPLY, add_special_tokens=False) + [tokenizer.eos_token_id]
    for end in range(1, len(ids) + 1):  # every cut, including ones inside a character
        detokenizer = IncrementalDetokenizer(tokenizer)
        deltas = [detokenizer.add(ids[i : min(i + chunk, end)]) for i in range(0, end, chunk)] + [detokenizer.flush()]
        assert "".join(deltas) == tokenizer.decode(ids[:end], skip_special_tokens=True)
        assert all("\ufffd" not in d for d in deltas[:-1]), "incomplete characters are held back"


def test_stop_string_helpers():
    assert find_stop("abcabc", ["c", "b"]) == 1
    assert find_stop("abc", ["x"]) is None
    assert partial_stop_length("hello wo", ["world", "wx"]) == 2
    assert partial_stop_length("hello", ["world"]) == 0
    assert partial_stop_length("abc", []) == 0


def test_serve_args():
    from adaflash_hf.targets import DEFAULT_TARGET

    args = ServeArgs()
    assert (args.target, args.host, args.port) == (DEFAULT_TARGET, "127.0.0.1", 8000)
    with pytest.raises(ValueError, match="--sources"):
        ServeArgs(sources="drafter,oracle")
    with pytest.raises(ValueError, match="--tree-nodes"):
        ServeArgs(tree_nodes=-1)
    assert ServeArgs(tree_nodes=0).drafting().tree_nodes == 0
    with pytest.raises(ValueError, match="--port"):
        ServeArgs(port=0)


@pytest.mark.parametrize("module", ["adaflash_hf.serve", "adaflash_hf.serving.server"])
def test_server_module_imports_without_web_stack(module):
    """The CLI reads ServeArgs without the serve extra: web, pydantic and torch imports stay inside functions."""
    import importlib

    server = importlib.import_module(module)
    tree = ast.parse(Path(server.__file__).read_text())
    top_level = [
        n.module if isinstance(n, ast.ImportFrom) else a.name
        for n in tree.body
        if isinstance(n, ast.Import | ast.ImportFrom)
        for a in (n.names if isinstance(n, ast.Import) else [n])
    ]
    assert top_level and not [
        m
        for m in top_level
        if m
        and m.split(".")[0]
        in {"fastapi", "uvicorn", "starlette", "pydantic", "jinja2", "torch", "transformers", "protocol", "scheduler"}
    ]


# --------------------------------------------------------------------------------------------------
# happy paths


def test_models_health_status(served):
    client = served.client()
    assert [m.id for m in client.models.list()] == [MODEL]
    assert httpx.get(f"{served.url}/health").json() == {"status": "ok"}
    status = httpx.get(f"{served.url}/v1/status").json()
    assert status["running"] is True and "counters" in status


def test_health_is_503_until_the_engine_takes_requests():
    scheduler = FakeScheduler(tiny_chat_tokenizer(), model_name=MODEL, max_context=128)
    with ServerThread(
        create_app(scheduler, manage_scheduler=False)
    ) as url:  # as `adaflash serve`: the engine starts later
        response = httpx.get(f"{url}/health")
        assert (
            response.status_code == 503
            and response.json()["status"] == "unavailable"
            and response.headers["retry-after"] == "1"
        )
        scheduler.start()
        assert httpx.get(f"{url}/health").json() == {"status": "ok"}
        scheduler.stop()
        assert httpx.get(f"{url}/health").status_code == 503


def test_completion(served):
    tokenizer = served.scheduler.tokenizer
    out = served.client().completions.create(
        model=MODEL,
        prompt="Hi there",
        max_tokens=100,
        temperature=0,
        seed=3,
        top_p=0.9,
        user="alice",
        n=1,
        presence_penalty=0,
    )
    assert out.object == "text_completion" and out.model == MODEL and out.id.startswith("cmpl-")
    assert out.choices[0].text == REPLY and out.choices[0].finish_reason == "stop"
    prompt_ids, params = served.scheduler.submitted[-1]
    assert prompt_ids == tokenizer("Hi there").input_ids
    assert (params.max_new_tokens, params.temperature, params.top_p, params.seed) == (100, 0.0, 0.9, 3)
    reply_tokens = len(served.scheduler.reply_ids)
    assert (out.usage.prompt_tokens, out.usage.completion_tokens, out.usage.total_tokens) == (
        len(prompt_ids),
        reply_tokens,
        len(prompt_ids) + reply_tokens,
    )
    assert out.model_extra["adaflash"]["num_tokens"] == reply_tokens


def test_completion_defaults(served):
    out = served.client().completions.create(model=MODEL, prompt=[5, 6, 7], extra_body={"top_k": 4})
    prompt_ids, params = served.scheduler.submitted[-1]
    assert prompt_ids == [5, 6, 7]
    assert (params.max_new_tokens, params.temperature, params.top_k) == (16, 1.0, 4)  # OpenAI's defaults
    assert out.choices[0].finish_reason == "length" and out.usage.completion_tokens == 16


def test_chat_completion(served):
    tokenizer = served.scheduler.tokenizer
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "Say "}, {"type": "text", "text": "hello"}]},
    ]
    out = served.client().chat.completions.create(model=MODEL, messages=messages, temperature=0)
    assert out.object == "chat.completion" and out.id.startswith("chatcmpl-")
    assert out.choices[0].message.role == "assistant" and out.choices[0].message.content == REPLY
    assert out.choices[0].finish_reason == "stop"
    expected = tokenizer.apply_chat_template(
        [messages[0], {"role": "user", "content": "Say hello"}],
        add_generation_prompt=True,
        tokenize=True,
        return_dict=True,
    )["input_ids"]
    prompt_ids, params = served.scheduler.submitted[-1]
    assert prompt_ids == expected
    assert params.max_new_tokens == 128 - len(expected), "chat defaults to the rest of the context"
    assert "mean_accepted_length" in out.model_extra["adaflash"]
    out = served.client().chat.completions.create(model=MODEL, messages=messages, max_completion_tokens=7)
    assert served.scheduler.submitted[-1][1].max_new_tokens == 7 and out.choices[0].finish_reason == "length"


def stream_completion(client, **kwargs) -> tuple[str, list]:
    chunks = list(client.completions.create(model=MODEL, prompt="Hi", stream=True, temperature=0, **kwargs))
    return "".join(c.choices[0].text for c in chunks if c.choices), chunks


def stream_chat(client, **kwargs) -> tuple[str, list]:
    chunks = list(
        client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "Hi"}], stream=True, temperature=0, **kwargs
        )
    )
    return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices), chunks


def test_streamed_text_equals_non_streamed_text_at_every_length(served):
    """Cut after every token count, including inside multi-byte characters (finish_reason "length")."""
    client, tokenizer, reply_ids = served.client(), served.scheduler.tokenizer, served.scheduler.reply_ids
    for max_tokens in range(1, len(reply_ids) + 1):
        full = client.completions.create(model=MODEL, prompt="Hi", max_tokens=max_tokens, temperature=0)
        streamed, chunks = stream_completion(client, max_tokens=max_tokens)
        assert streamed == full.choices[0].text == tokenizer.decode(reply_ids[:max_tokens], skip_special_tokens=True)
        expected_reason = "stop" if max_tokens == len(reply_ids) else "length"
        assert chunks[-1].choices[0].finish_reason == full.choices[0].finish_reason == expected_reason
        assert all(c.choices[0].finish_reason is None for c in chunks[:-1])


def test_streaming_chat_and_usage(served):
    client = served.client()
    full = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}], temperature=0)
    streamed, chunks = stream_chat(client, stream_options={"include_usage": True})
    assert streamed == full.choices[0].message.content == REPLY
    assert chunks[0].choices[0].delta.role == "assistant"
    assert all(c.usage is None for c in chunks[:-1])
    assert chunks[-1].choices == [] and chunks[-1].usage.model_dump() == full.usage.model_dump()
    assert chunks[-2].choices[0].finish_reason == "stop" and "ttft_s" in chunks[-2].model_extra["adaflash"]
    streamed, chunks = stream_completion(client, max_tokens=100, stream_options={"include_usage": True})
    assert streamed == REPLY and chunks[-1].usage.completion_tokens == full.usage.completion_tokens


def test_concurrent_streams(served):
    served.scheduler.delay_s = 0.005

    async def main():
        client = openai.AsyncOpenAI(base_url=f"{served.url}/v1", api_key="unused", max_retries=0)

        async def one(i):
            chunks = await client.completions.create(model=MODEL, prompt=f"Hi {i}", max_tokens=100, stream=True)
            return "".join([c.choices[0].text async for c in chunks])

        return await asyncio.gather(*(one(i) for i in range(8)))

    assert asyncio.run(main()) == [REPLY] * 8


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(
    "stop, expected",
    [
        ("世界", REPLY[: REPLY.index("世界")]),
        (["done", "wö"], REPLY[: REPLY.index("wö")]),  # the earliest match wins
        ("🚀🎉", REPLY[: REPLY.index("🚀🎉")]),  # spans tokens that split characters
        (["va?X", "Emoji: 🙂🚀🎉 done.!"], REPLY),  # partial matches are held back, then released
    ],
)
def test_stop_strings(served, stream, stop, expected):
    client, fake = served.client(), served.scheduler
    if stream:
        text, chunks = stream_completion(client, max_tokens=100, stop=stop)
        finish_reason = chunks[-1].choices[0].finish_reason
    else:
        out = client.completions.create(model=MODEL, prompt="Hi", max_tokens=100, stop=stop, temperature=0)
        text, finish_reason = out.choices[0].text, out.choices[0].finish_reason
    assert text == expected and finish_reason == "stop"
    matched = expected != REPLY
    assert (f"req-{len(fake.submitted) - 1}" in fake.cancelled) == matched, "a matched stop string cancels the request"


# --------------------------------------------------------------------------------------------------
# bad requests: a clear OpenAI-shaped error, and the server keeps serving


def completion(**fields) -> dict:
    return {"model": MODEL, "prompt": "Hi", **fields}


def chat(**fields) -> dict:
    return {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], **fields}


BAD_REQUESTS = [  # (path, body, status, message, param)
    ("/v1/completions", completion(foo=1), 400, "Unrecognized request argument supplied: foo", "foo"),
    (
        "/v1/completions",
        completion(stream=True, stream_options={"usage": True}),
        400,
        "Unrecognized request argument supplied: stream_options.usage",
        "stream_options.usage",
    ),
    (
        "/v1/completions",
        completion(max_tokens=-1),
        400,
        "max_tokens: Input should be greater than or equal to 1",
        "max_tokens",
    ),
    (
        "/v1/completions",
        completion(max_tokens=0),
        400,
        "max_tokens: Input should be greater than or equal to 1",
        "max_tokens",
    ),
    ("/v1/completions", completion(max_tokens="10"), 400, "max_tokens: Input should be a valid integer", "max_tokens"),
    (
        "/v1/completions",
        completion(temperature="hot"),
        400,
        "temperature: Input should be a valid number",
        "temperature",
    ),
    (
        "/v1/completions",
        completion(temperature=3),
        400,
        "temperature: Input should be less than or equal to 2",
        "temperature",
    ),
    ("/v1/completions", completion(top_p=0), 400, "top_p: Input should be greater than 0", "top_p"),
    ("/v1/completions", completion(timeout=0), 400, "timeout: Input should be greater than 0", "timeout"),
    ("/v1/completions", completion(timeout="5"), 400, "timeout: Input should be a valid number", "timeout"),
    (
        "/v1/completions",
        completion(prompt=12),
        400,
        "prompt: prompt must be a string or a list of token ids.",
        "prompt",
    ),
    (
        "/v1/completions",
        completion(prompt=["a", "b"]),
        400,
        "prompt: batched prompts are not supported: send one request per prompt.",
        "prompt",
    ),
    ("/v1/completions", completion(prompt=[]), 400, "the prompt is empty: give at least one token.", None),
    ("/v1/completions", completion(prompt=[5, 10_000]), 400, "prompt token ids are outside the vocabulary", None),
    (
        "/v1/completions",
        completion(n=2),
        400,
        "n: n=2 is not supported: this server returns one choice per request",
        "n",
    ),
    (
        "/v1/completions",
        completion(logprobs=1),
        400,
        "logprobs: logprobs is not supported by this server; omit it.",
        "logprobs",
    ),
    (
        "/v1/completions",
        completion(frequency_penalty=0.5),
        400,
        "frequency_penalty: frequency_penalty is not supported",
        "frequency_penalty",
    ),
    ("/v1/completions", completion(stop=["a"] * 5), 400, "stop: stop takes at most 4 non-empty strings", "stop"),
    (
        "/v1/completions",
        completion(stream_options={"include_usage": True}),
        400,
        "stream_options is only allowed when stream is true.",
        None,
    ),
    ("/v1/completions", {"prompt": "Hi"}, 400, "model: missing required argument", "model"),
    ("/v1/completions", completion(model="gpt-4"), 404, "The model 'gpt-4' does not exist", "model"),
    (
        "/v1/completions",
        completion(prompt=[5] * 200),
        400,
        "the prompt has 200 tokens, which leaves no room in this model's context of 128 tokens: shorten the prompt.",
        None,
    ),
    (
        "/v1/completions",
        completion(prompt=[5] * 100, max_tokens=50),
        400,
        "the prompt has 100 tokens and asks for 50 more, past this model's context of 128 tokens",
        None,
    ),
    ("/v1/completions", [completion()], 400, "the request body must be a JSON object.", None),
    ("/v1/chat/completions", chat(messages=[]), 400, "messages: List should have at least 1 item", "messages"),
    (
        "/v1/chat/completions",
        chat(messages=[{"role": "tool", "content": "x"}]),
        400,
        "messages[0].role: Input should be 'system', 'user' or 'assistant'",
        "messages[0].role",
    ),
    (
        "/v1/chat/completions",
        chat(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]),
        400,
        "messages[0].content: only text content parts",
        "messages[0].content",
    ),
    (
        "/v1/chat/completions",
        chat(messages=[{"role": "user", "content": "x", "name": "bob"}]),
        400,
        "Unrecognized request argument supplied: messages[0].name",
        "messages[0].name",
    ),
    (
        "/v1/chat/completions",
        chat(logprobs=True),
        400,
        "logprobs: logprobs is not supported by this server",
        "logprobs",
    ),
    (
        "/v1/chat/completions",
        chat(max_completion_tokens=-5),
        400,
        "max_completion_tokens: Input should be greater than or equal to 1",
        "max_completion_tokens",
    ),
]


@pytest.mark.parametrize("path, body, status, message, param", BAD_REQUESTS)
def test_bad_requests(served, path, body, status, message, param):
    response = served.post(path, json=body)
    assert response.status_code == status
    error = response.json()["error"]
    assert error["message"].startswith(message), error["message"]
    assert error["param"] == param and error["type"] == "invalid_request_error"


def test_bad_requests_keep_serving(served):
    for path, body, status, _, _ in BAD_REQUESTS:
        assert served.post(path, json=body).status_code == status
    assert_still_serving(served)


@pytest.mark.parametrize("content", [b'{"model": "fake-model", "prompt": "Hi",', b"not json", b""])
def test_malformed_json(served, content):
    response = served.post("/v1/completions", content=content, headers={"Content-Type": "application/json"})
    assert response.status_code == 400
    message = response.json()["error"]["message"]
    assert (
        message.startswith("the request body is not valid JSON") or message == "the request body must be a JSON object."
    )
    assert_still_serving(served)


def test_unknown_field_through_openai_client(served):
    with pytest.raises(openai.BadRequestError, match="Unrecognized request argument supplied: best_of"):
        served.client().completions.create(model=MODEL, prompt="Hi", best_of=2)
    with pytest.raises(openai.BadRequestError, match="Unrecognized request argument supplied: tools"):
        served.client().chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "Hi"}],
            tools=[{"type": "function", "function": {"name": "f"}}],
        )
    assert_still_serving(served)


def test_scheduler_value_error_is_a_400(served):
    served.scheduler.reject = "top_k=4 is larger than the vocabulary."
    with pytest.raises(openai.BadRequestError, match="top_k=4 is larger than the vocabulary."):
        served.client().completions.create(model=MODEL, prompt="Hi")
    assert_still_serving(served)


def test_unknown_route_is_openai_shaped(served):
    response = httpx.get(f"{served.url}/v1/nothing")
    assert response.status_code == 404 and response.json()["error"]["message"] == "Not Found"


@pytest.mark.parametrize("stream", [False, True])
def test_queue_full_is_429_with_retry_after(served, stream):
    served.scheduler.queue_full = True
    response = served.post("/v1/completions", json=completion(stream=stream))
    assert response.status_code == 429 and response.headers["Retry-After"] == "3"  # ceil(2.5 s)
    assert response.json()["error"] == {
        "message": "the queue is full (0 requests waiting); retry later.",
        "type": "rate_limit_error",
        "param": None,
        "code": "queue_full",
    }
    with pytest.raises(openai.RateLimitError):
        served.client().chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}])
    assert_still_serving(served)


def test_a_request_while_the_engine_is_not_running_is_503_with_retry_after(served):
    served.scheduler.running = False  # as between the port opening and the engine loop, or after it ended
    try:
        response = served.post("/v1/completions", json=completion())
    finally:
        served.scheduler.running = True
    assert response.status_code == 503 and response.headers["Retry-After"] == "5"
    error = response.json()["error"]
    assert error["code"] == "engine_not_running" and "retry shortly" in error["message"], error
    assert_still_serving(served)


@pytest.mark.parametrize(
    "path, body",
    [("/v1/completions", completion(max_tokens=100, stream=True)), ("/v1/chat/completions", chat(stream=True))],
)
def test_client_disconnect_mid_stream_cancels(served, path, body):
    fake = served.scheduler
    fake.delay_s = 0.05  # about 1 s for the whole reply
    with httpx.Client(timeout=10) as client, client.stream("POST", f"{served.url}{path}", json=body) as response:
        assert response.status_code == 200
        first = next(line for line in response.iter_lines() if line.startswith("data: "))
        assert json.loads(first.removeprefix("data: "))["choices"]
        request_id = f"req-{len(fake.submitted) - 1}"
    assert wait_for(lambda: request_id in fake.cancelled), "the disconnect cancelled the request"
    assert_still_serving(served)


def test_client_disconnect_while_waiting_cancels(served):
    fake = served.scheduler
    fake.delay_s = 0.05
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{served.url}/v1/completions", json=completion(max_tokens=100), timeout=0.2)
    request_id = f"req-{len(fake.submitted) - 1}"
    assert wait_for(lambda: request_id in fake.cancelled), "the disconnect cancelled the request"
    assert_still_serving(served)


def test_engine_error(served):
    served.scheduler.fail_after = 2
    response = served.post("/v1/completions", json=completion(max_tokens=100))
    assert response.status_code == 500
    assert response.json()["error"]["message"] == "generation failed: RuntimeError: injected engine failure"
    with pytest.raises(openai.APIError, match="injected engine failure"):
        stream_chat(served.client())
    assert_still_serving(served)


@pytest.mark.parametrize(
    "template, message",
    [
        (None, "this tokenizer has no chat template"),
        (
            "{{ raise_exception('system messages are not supported') }}",
            "the model's chat template rejected these messages: system messages are not supported",
        ),
    ],
)
def test_chat_template_problems_are_400(served, template, message):
    tokenizer = served.scheduler.tokenizer
    saved, tokenizer.chat_template = tokenizer.chat_template, template
    try:
        response = served.post("/v1/chat/completions", json=chat())
    finally:
        tokenizer.chat_template = saved
    assert response.status_code == 400 and response.json()["error"]["message"].startswith(message)
    assert_still_serving(served)


def test_serve_on_a_port_in_use_says_so_before_loading_anything():
    import socket

    from adaflash_hf.serve import run_serve

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(ValueError, match=f"cannot listen on 127.0.0.1:{port}.*--port"):
            run_serve(ServeArgs(target="/no/such/model", port=port))  # the port is checked first: no load is tried
