"""What a deployment relies on, against a real uvicorn server with `FakeScheduler`: the API key, Prometheus
metrics, refusals while draining, per-request deadlines; and the demo's address from Gradio's environment.
The same behaviours on the real engine are in test_serving_e2e.py."""

from __future__ import annotations

import logging
import signal

import pytest

fastapi = pytest.importorskip("fastapi", reason="needs the serve extra: pip install -e '.[serve,dev]'")
httpx = pytest.importorskip("httpx")
openai = pytest.importorskip("openai")
prometheus_client = pytest.importorskip("prometheus_client")

from fake_scheduler import REPLY, FakeScheduler, tiny_chat_tokenizer  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from adaflash_hf.demo import DemoArgs  # noqa: E402
from adaflash_hf.serve import ServeArgs  # noqa: E402
from adaflash_hf.serving.app import create_app  # noqa: E402
from adaflash_hf.serving.auth import key_matches, warn_if_exposed  # noqa: E402
from adaflash_hf.serving.metrics import SchedulerCollector  # noqa: E402
from adaflash_hf.serving.server import DrainOnSignal, ServerThread  # noqa: E402

MODEL = "fake-model"
KEY = "s3cret-key"


def completion(**fields) -> dict:
    return {"model": MODEL, "prompt": "Hi", "max_tokens": 100, "temperature": 0, **fields}


def samples(url: str) -> dict[tuple[str, tuple], float]:
    """{(sample name, sorted labels): value} of a /metrics scrape."""
    response = httpx.get(f"{url}/metrics", timeout=10)
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/plain")
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(response.text)
        for s in family.samples
    }


@pytest.fixture(scope="module")
def keyed():
    scheduler = FakeScheduler(tiny_chat_tokenizer(), model_name=MODEL, max_context=128)
    with ServerThread(create_app(scheduler, api_key=KEY, request_timeout=30)) as url:
        yield url, scheduler


# --------------------------------------------------------------------------------------------------
# API key


@pytest.mark.parametrize(
    "headers, message",
    [
        ({}, "Missing API key"),
        ({"Authorization": "Bearer wrong"}, "Incorrect API key provided"),
        ({"Authorization": KEY}, "Incorrect API key provided"),  # no scheme
        ({"Authorization": f"Basic {KEY}"}, "Incorrect API key provided"),
    ],
)
@pytest.mark.parametrize(
    "method, path",
    [
        ("POST", "/v1/completions"),
        ("POST", "/v1/chat/completions"),
        ("GET", "/v1/models"),
        ("GET", "/v1/status"),
        ("GET", "/v1/nothing-here"),
    ],
)
def test_every_v1_route_needs_the_key(keyed, headers, message, method, path):
    url, _ = keyed
    response = httpx.request(method, f"{url}{path}", headers=headers, content=b"{not json", timeout=10)
    assert response.status_code == 401 and response.headers["WWW-Authenticate"] == "Bearer"
    error = response.json()["error"]  # before the body is read: malformed JSON is not what it reports
    assert error["message"].startswith(message) and "Bearer" in error["message"]
    assert error["type"] == "invalid_request_error" and error["code"] == "invalid_api_key"


def test_the_right_key_serves_and_health_and_metrics_stay_open(keyed):
    url, _ = keyed
    wrong = openai.OpenAI(base_url=f"{url}/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        wrong.models.list()
    with pytest.raises(openai.AuthenticationError):  # a generation request refused: counted by outcome
        wrong.completions.create(model=MODEL, prompt="Hi", max_tokens=4)
    client = openai.OpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0)
    assert client.completions.create(model=MODEL, prompt="Hi", max_tokens=100, temperature=0).choices[0].text == REPLY
    assert httpx.get(f"{url}/health", timeout=10).status_code == 200
    assert samples(url)[("adaflash_requests_total", (("outcome", "unauthorized"),))] >= 1


def test_key_comparison_and_the_warning_for_an_exposed_server(caplog, monkeypatch):
    assert key_matches(b"Bearer k1", "k1") and key_matches(b"bearer k1", "k1")
    assert not key_matches(b"Bearer k2", "k1") and not key_matches(None, "k1") and not key_matches(b"Token k1", "k1")
    with caplog.at_level(logging.WARNING, logger="adaflash_hf.serving.auth"):
        assert not warn_if_exposed("127.0.0.1", None) and not warn_if_exposed("::1", None)
        assert not warn_if_exposed("localhost", None) and not warn_if_exposed("0.0.0.0", KEY)
        assert not caplog.records
        assert warn_if_exposed("0.0.0.0", None) and warn_if_exposed("10.1.2.3", None)
    assert "WITHOUT an API key" in caplog.text and "--api-key" in caplog.text
    monkeypatch.setenv("ADAFLASH_API_KEY", "from-env")
    assert ServeArgs().api_key == "from-env" and ServeArgs(api_key="flag").api_key == "flag"
    assert "from-env" not in repr(ServeArgs())
    monkeypatch.delenv("ADAFLASH_API_KEY")
    assert ServeArgs().api_key is None
    with pytest.raises(ValueError, match="--api-key is empty"):
        ServeArgs(api_key=" ")


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("request_timeout", 0, "--request-timeout 0: must be a number of seconds > 0"),
        ("request_timeout", float("inf"), "--request-timeout inf: must be a number of seconds > 0"),
        ("drain_timeout", -1, "--drain-timeout -1: must be a number of seconds >= 0"),
    ],
)
def test_serve_args_refuse_bad_deadlines(field, value, message):
    with pytest.raises(ValueError, match=message):
        ServeArgs(**{field: value})


# --------------------------------------------------------------------------------------------------
# metrics


def test_metrics_count_requests_tokens_and_timings(keyed):
    url, scheduler = keyed
    before = samples(url)
    client = openai.OpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0)
    out = client.completions.create(model=MODEL, prompt="Hi", max_tokens=100, temperature=0)
    streamed = list(client.completions.create(model=MODEL, prompt="Hi", max_tokens=100, temperature=0, stream=True))
    assert streamed
    scheduler.queue_full = True
    with pytest.raises(openai.RateLimitError):
        client.completions.create(model=MODEL, prompt="Hi", max_tokens=5)
    scheduler.reset()
    after = samples(url)

    def delta(name, **labels):
        key = (name, tuple(sorted(labels.items())))
        return after[key] - before.get(key, 0)

    assert delta("adaflash_requests_total", outcome="success") == 2
    assert delta("adaflash_requests_total", outcome="rate_limited") == 1
    assert delta("adaflash_prompt_tokens_total") == 2 * out.usage.prompt_tokens
    assert delta("adaflash_generation_tokens_total") == 2 * out.usage.completion_tokens
    for histogram in (
        "adaflash_request_latency_seconds",
        "adaflash_time_to_first_token_seconds",
        "adaflash_time_per_output_token_seconds",
    ):
        assert delta(f"{histogram}_count") == 2 and delta(f"{histogram}_sum") > 0
    for gauge in ("adaflash_requests_running", "adaflash_requests_waiting", "adaflash_batch_size"):
        assert (gauge, ()) in after
    assert ("adaflash_accepted_tokens_per_round_count", ()) in after


def test_each_server_has_its_own_registry():
    scheduler = FakeScheduler(tiny_chat_tokenizer(), model_name=MODEL)
    first, second = create_app(scheduler), create_app(scheduler)  # the global registry would refuse the second
    assert first.state.metrics.registry is not second.state.metrics.registry


def test_engine_series_come_from_the_scheduler_at_scrape_time():
    class Engine:
        def status(self):
            opd = {"adapter_version": 4, "state": "training"}
            return {"active": 3, "queued": 7, "opd": opd, "counters": {"draft_failures": 2}}

        def round_stats(self):
            drafts = {("drafter", 1): (7, 4), ("drafter", 2): (7, 2), ("suffix", 1): (1, 0)}
            return {"batch_size": 3, "round_tokens": {1: 5, 3: 2}, "drafts": drafts}

    registry = prometheus_client.CollectorRegistry()
    registry.register(SchedulerCollector(Engine()))
    value = registry.get_sample_value
    assert value("adaflash_requests_running") == 3 and value("adaflash_requests_waiting") == 7
    assert value("adaflash_batch_size") == 3
    assert value("adaflash_accepted_tokens_per_round_count") == 7
    assert value("adaflash_accepted_tokens_per_round_sum") == 4
    assert value("adaflash_accepted_tokens_per_round_bucket", {"le": "0.0"}) == 5
    assert value("adaflash_accepted_tokens_per_round_bucket", {"le": "2.0"}) == 7
    assert value("adaflash_draft_tokens_proposed_total", {"source": "drafter", "position": "2"}) == 7
    assert value("adaflash_draft_tokens_accepted_total", {"source": "drafter", "position": "2"}) == 2
    assert value("adaflash_draft_tokens_accepted_total", {"source": "suffix", "position": "1"}) == 0
    assert value("adaflash_draft_failures_total") == 2
    assert value("adaflash_opd_adapter_version") == 4
    assert value("adaflash_opd_trainer_state", {"state": "training"}) == 1


# --------------------------------------------------------------------------------------------------
# drain, deadlines


def test_a_draining_server_refuses_new_requests_with_503_and_retry_after():
    scheduler = FakeScheduler(tiny_chat_tokenizer(), model_name=MODEL)
    with ServerThread(create_app(scheduler)) as url:
        scheduler.drain(30)
        response = httpx.post(f"{url}/v1/completions", json=completion(), timeout=10)
        assert response.status_code == 503 and response.headers["Retry-After"] == "5"
        assert response.json()["error"]["code"] == "shutting_down"
        assert "shutting down" in response.json()["error"]["message"]
        health = httpx.get(f"{url}/health", timeout=10)
        assert health.status_code == 503 and health.json()["status"] == "draining"
        assert samples(url)[("adaflash_requests_total", (("outcome", "unavailable"),))] == 1


def test_the_first_signal_drains_and_the_second_exits_at_once():
    drained, exits = [], []

    class Engine:
        def drain(self, timeout):
            drained.append(timeout)

    handler = DrainOnSignal(Engine(), drain_timeout=12.5, exit_now=exits.append)
    handler(signal.SIGTERM)
    assert drained == [12.5] and exits == []
    handler(signal.SIGINT)
    assert drained == [12.5] and exits == [128 + signal.SIGINT]


@pytest.mark.parametrize("sent, used", [(None, 30), (100, 30), (5, 5)])
def test_the_deadline_is_the_request_timeout_capped_by_the_server_default(keyed, sent, used):
    url, scheduler = keyed
    body = completion() if sent is None else completion(timeout=sent)
    assert (
        httpx.post(
            f"{url}/v1/completions", json=body, headers={"Authorization": f"Bearer {KEY}"}, timeout=10
        ).status_code
        == 200
    )
    assert scheduler.submitted[-1][1].timeout == used


# --------------------------------------------------------------------------------------------------
# the demo's address


def test_the_demo_binds_where_gradio_is_told_unless_flags_say_otherwise(monkeypatch):
    monkeypatch.delenv("GRADIO_SERVER_NAME", raising=False)
    monkeypatch.delenv("GRADIO_SERVER_PORT", raising=False)
    assert (DemoArgs().host, DemoArgs().port) == ("127.0.0.1", 7860)
    monkeypatch.setenv("GRADIO_SERVER_NAME", "0.0.0.0")
    monkeypatch.setenv("GRADIO_SERVER_PORT", "7999")
    assert (DemoArgs().host, DemoArgs().port) == ("0.0.0.0", 7999)
    assert (DemoArgs(host="127.0.0.1", port=8001).host, DemoArgs(port=8001).port) == ("127.0.0.1", 8001)
    monkeypatch.setenv("GRADIO_SERVER_PORT", "http")
    with pytest.raises(ValueError, match="GRADIO_SERVER_PORT='http' is not a port number.*--port"):
        DemoArgs()
    assert DemoArgs(port=8002).port == 8002
    monkeypatch.setenv("GRADIO_SERVER_PORT", "70000")
    with pytest.raises(ValueError, match="--port 70000: choose a TCP port in 1..65535"):
        DemoArgs()


# --------------------------------------------------------------------------------------------------
# layering


def test_serving_imports_neither_online_nor_the_commands_above_it():
    """decoding < serving < online < the commands (serve, demo, cli): the OPD soak drives the serving scheduler,
    so serving takes the OPD trainer as a plain object and `adaflash_hf.serve` wires the two together."""
    import ast
    from pathlib import Path

    import adaflash_hf

    package = Path(adaflash_hf.__file__).parent
    above = {"online", "serve", "demo", "cli"}
    for path in sorted((package / "serving").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                parts = node.module.split(".")
                absolute = parts[0] == "adaflash_hf" and len(parts) > 1
                top = parts[0] if node.level == 2 else parts[1] if absolute else None
                assert top not in above, f"serving/{path.name} imports {node.module}"
    demo = (package / "demo.py").read_text()
    assert "serving.server" not in demo and "serving.app" not in demo  # shared helpers live below serving
