"""The real serving stack end to end: OpenAI client -> HTTP server -> Scheduler -> SpeculativeBatch.

fp32 greedy outputs through the server equal the target's own output for every request, while requests
join and leave mid-generation (staggered starts, different lengths, one client that disconnects).
"""

from __future__ import annotations

import asyncio
import json
import time

import pytest
import torch
from fake_scheduler import tiny_chat_models

openai = pytest.importorskip("openai")
uvicorn = pytest.importorskip("uvicorn")


@pytest.fixture(scope="module")
def stack():
    from adaflash_hf.serving.app import create_app
    from adaflash_hf.serving.scheduler import Scheduler, SchedulerConfig
    from adaflash_hf.serving.server import ServerThread

    target, drafter, tokenizer = tiny_chat_models(max_positions=256)
    scheduler = Scheduler(
        target, drafter, tokenizer, SchedulerConfig(max_batch_size=3, calibrate=False), model_name="tiny"
    )
    with ServerThread(create_app(scheduler)) as url:
        yield f"{url}/v1", target, tokenizer, scheduler


def reference_text(target, tokenizer, prompt: list[int], max_new_tokens: int) -> str:
    out = target.generate(
        torch.tensor([prompt]), max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=tokenizer.pad_token_id
    )
    return tokenizer.decode(out[0, len(prompt) :], skip_special_tokens=True)


def test_greedy_outputs_through_the_server_equal_the_target(stack):
    url, target, tokenizer, scheduler = stack
    generator = torch.Generator().manual_seed(5)
    prompts = [torch.randint(3, len(tokenizer), (n,), generator=generator).tolist() for n in (5, 12, 7, 9, 4, 15)]
    budgets = [24, 10, 30, 16, 20, 12]
    before = scheduler.status()["counters"]

    async def one(client, i):
        await asyncio.sleep(0.02 * i)  # later requests join a running batch; short ones leave early
        if i % 2:
            text = ""
            stream = await client.completions.create(
                model="tiny", prompt=prompts[i], max_tokens=budgets[i], temperature=0, stream=True
            )
            async for chunk in stream:
                text += chunk.choices[0].text if chunk.choices else ""
            return text
        reply = await client.completions.create(model="tiny", prompt=prompts[i], max_tokens=budgets[i], temperature=0)
        return reply.choices[0].text

    async def disconnecting(client):
        stream = await client.completions.create(
            model="tiny", prompt=prompts[0], max_tokens=200, temperature=0, stream=True
        )
        async for _ in stream:
            break
        await stream.close()

    async def main():
        async with openai.AsyncOpenAI(base_url=url, api_key="unused", max_retries=0) as client:
            results = await asyncio.gather(disconnecting(client), *(one(client, i) for i in range(len(prompts))))
        return results[1:]

    texts = asyncio.run(main())
    for i, text in enumerate(texts):
        assert text == reference_text(target, tokenizer, prompts[i], budgets[i]), f"request {i}"
    deadline = time.monotonic() + 10
    while scheduler.status()["active"] and time.monotonic() < deadline:
        time.sleep(0.05)
    after = scheduler.status()["counters"]
    assert after["finished"] - before["finished"] == len(prompts)
    assert after["cancelled"] - before["cancelled"] == 1


def test_the_load_generator_reports_every_request(stack):
    from adaflash_hf.serving.loadtest import drive
    from adaflash_hf.serving.loadtest_report import percentile, summarise

    url, _, _, scheduler = stack
    before = scheduler.status()
    prompts = ["Hello there", "wörld café", "你好", "Emoji 🙂", "naïve"]
    records, seconds, peak = asyncio.run(drive(url.removesuffix("/v1"), "tiny", prompts, concurrency=2, max_tokens=6))
    row = summarise("adaflash", 2, records, seconds, peak, before, scheduler.status())
    assert row["num_requests"] == len(prompts) and row["output_tokens"] == sum(r["tokens"] for r in records) > 0
    assert 0 < row["p50_latency_s"] <= row["p99_latency_s"] and row["ttft_p50_s"] is not None
    assert row["mean_accepted_length"] >= 1 and row["peak_rss_mb"] > 0
    assert all(r["queue_wait_s"] is not None for r in records)
    assert percentile([3.0, 1.0, 2.0], 50) == 2.0


def wait_idle(scheduler, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while (scheduler.status()["active"] or scheduler.status()["queued"]) and time.monotonic() < deadline:
        time.sleep(0.02)


def test_a_client_that_disconnects_mid_stream_frees_its_row(stack):
    import httpx

    url, _, _, scheduler = stack
    before = scheduler.status()["counters"]
    body = {"model": "tiny", "prompt": [9, 40, 41, 12], "max_tokens": 240, "temperature": 0, "stream": True}
    with httpx.Client(timeout=30) as client, client.stream("POST", f"{url}/completions", json=body) as response:
        assert next(line for line in response.iter_lines() if line.startswith("data: "))
    wait_idle(scheduler)
    after = scheduler.status()["counters"]
    assert scheduler.status()["active"] == 0 and after["cancelled"] - before["cancelled"] == 1
    assert after["finished"] == before["finished"] and after["generated_tokens"] - before["generated_tokens"] < 240


def test_a_request_past_its_deadline_gets_a_clear_error(stack):
    import httpx

    url, _, _, scheduler = stack
    before = scheduler.status()["counters"]["timeouts"]
    body = {"model": "tiny", "prompt": [9, 40, 41, 12], "max_tokens": 200, "temperature": 0, "timeout": 1e-6}
    response = httpx.post(f"{url}/completions", json=body, timeout=30)
    assert response.status_code == 408
    error = response.json()["error"]
    assert error["code"] == "request_timeout" and error["type"] == "timeout_error" and error["param"] == "timeout"
    assert error["message"].startswith("the request passed its deadline of 1e-06 s after 0 tokens")
    with (
        httpx.Client(timeout=30) as client,
        client.stream("POST", f"{url}/completions", json={**body, "stream": True}) as streamed,
    ):
        events = [line.removeprefix("data: ") for line in streamed.iter_lines() if line.startswith("data: ")]
    assert streamed.status_code == 200 and events[-1] == "[DONE]"
    assert json.loads(events[-2])["error"]["code"] == "request_timeout"
    wait_idle(scheduler)
    assert scheduler.status()["counters"]["timeouts"] - before == 2 and scheduler.status()["active"] == 0


def test_a_flood_past_the_queue_gets_only_200s_and_429s():
    """Far more requests at once than batch + queue hold: every one is answered, with its full greedy output or
    429 and Retry-After; nothing is lost, nothing errors, nothing hangs."""
    import httpx

    from adaflash_hf.serving.app import create_app
    from adaflash_hf.serving.scheduler import Scheduler, SchedulerConfig
    from adaflash_hf.serving.server import ServerThread

    target, drafter, tokenizer = tiny_chat_models(max_positions=256)
    scheduler = Scheduler(
        target, drafter, tokenizer, SchedulerConfig(max_batch_size=2, max_queue=3, calibrate=False), model_name="tiny"
    )
    prompts = [[5, 6, 7 + i] for i in range(4)]
    references = [reference_text(target, tokenizer, p, 8) for p in prompts]

    async def flood(url):
        async with httpx.AsyncClient(timeout=60, limits=httpx.Limits(max_connections=64)) as client:
            return await asyncio.gather(
                *(
                    client.post(
                        f"{url}/v1/completions",
                        json={"model": "tiny", "prompt": prompts[i % 4], "max_tokens": 8, "temperature": 0},
                    )
                    for i in range(48)
                )
            )

    with ServerThread(create_app(scheduler)) as url:
        responses = asyncio.run(asyncio.wait_for(flood(url), 120))
        wait_idle(scheduler)
        counters = scheduler.status()["counters"]
        metrics = httpx.get(f"{url}/metrics", timeout=10).text
    statuses = [r.status_code for r in responses]
    assert set(statuses) == {200, 429}, statuses
    for i, response in enumerate(responses):
        if response.status_code == 429:
            assert int(response.headers["Retry-After"]) >= 1 and response.json()["error"]["code"] == "queue_full"
        else:
            assert response.json()["choices"][0]["text"] == references[i % 4]
    assert counters["finished"] == counters["submitted"] == statuses.count(200)
    assert counters["rejected_queue_full"] == statuses.count(429) and counters["errors"] == 0
    assert f'adaflash_requests_total{{outcome="rate_limited"}} {float(statuses.count(429))}' in metrics
    assert f'adaflash_requests_total{{outcome="success"}} {float(statuses.count(200))}' in metrics
    assert 'adaflash_draft_tokens_proposed_total{position="1",source=' in metrics
    assert "adaflash_accepted_tokens_per_round_count" in metrics and "adaflash_requests_waiting 0.0" in metrics


def free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_serve_drains_on_a_signal_and_stops_the_opd_trainer():
    """serve() in this process: SIGTERM while a request streams lets it finish, ends the engine loop, stops the
    trainer and returns (the process test below covers refusals and the exit status)."""
    import os
    import signal
    import threading

    import httpx

    from adaflash_hf.serving.app import create_app
    from adaflash_hf.serving.scheduler import Scheduler, SchedulerConfig
    from adaflash_hf.serving.server import serve

    class Trainer:  # the part of AdaFlashOPD that the engine calls
        observer, inline = None, False

        def __init__(self):
            self.calls = []

        def start(self):
            self.calls.append("start")

        def stop(self):
            self.calls.append("stop")

        def check_health(self):
            return True

    target, drafter, tokenizer = tiny_chat_models(max_positions=256)
    trainer, port, lines = Trainer(), free_port(), []
    scheduler = Scheduler(
        target, drafter, tokenizer, SchedulerConfig(max_batch_size=2, calibrate=False), model_name="tiny", opd=trainer
    )

    def client():
        body = {"model": "tiny", "prompt": [9, 40, 41, 12], "max_tokens": 240, "temperature": 0, "stream": True}
        deadline, signalled = time.monotonic() + 60, False
        try:
            while time.monotonic() < deadline:
                try:
                    with (
                        httpx.Client(timeout=60) as http,
                        http.stream("POST", f"http://127.0.0.1:{port}/v1/completions", json=body) as response,
                    ):
                        events = (line for line in response.iter_lines() if line.startswith("data: "))
                        lines.append(next(events))
                        signalled = True
                        os.kill(os.getpid(), signal.SIGTERM)  # to the main thread, which runs the engine
                        lines.extend(events)
                        return
                except httpx.ConnectError:  # not listening yet
                    time.sleep(0.05)
        finally:  # whatever went wrong, stop the server: the assertions below fail instead of the test hanging
            if not signalled:
                os.kill(os.getpid(), signal.SIGTERM)

    previous = {signum: signal.getsignal(signum) for signum in (signal.SIGTERM, signal.SIGINT)}
    worker = threading.Thread(target=client)
    worker.start()
    try:
        serve(scheduler, create_app(scheduler, manage_scheduler=False), "127.0.0.1", port, drain_timeout=60)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        worker.join(30)
    assert lines[-1] == "data: [DONE]", lines[-3:]
    assert json.loads(lines[-2].removeprefix("data: "))["choices"][0]["finish_reason"] == "length"
    assert trainer.calls == ["start", "stop"] and not scheduler.ready and scheduler.draining


def test_serve_opens_its_port_only_once_the_scheduler_admits_requests(monkeypatch):
    """A request that arrives the moment the port opens is queued, not refused: the scheduler admits before uvicorn
    listens (a 500 "not running" to such a request was seen when the port opened first)."""
    import signal

    import httpx

    from adaflash_hf.serving import server
    from adaflash_hf.serving.app import create_app
    from adaflash_hf.serving.scheduler import Scheduler, SchedulerConfig

    target, drafter, tokenizer = tiny_chat_models(max_positions=64)
    scheduler = Scheduler(
        target, drafter, tokenizer, SchedulerConfig(max_batch_size=1, calibrate=False), model_name="t"
    )
    seen = []

    class FirstRequestAtOnce(server.ServerThread):
        def __enter__(self):
            url = super().__enter__()
            seen.append(scheduler.status()["running"])
            body = {"model": "t", "prompt": [9, 40], "max_tokens": 2, "stream": False}
            # not answered before the loop runs: a short timeout, and what matters is that it was not refused
            try:
                seen.append(httpx.post(f"{url}/v1/completions", json=body, timeout=0.5).status_code)
            except httpx.TimeoutException:
                seen.append("queued")
            scheduler.stop()  # from the engine's own thread: the loop ends as soon as it starts
            return url

    monkeypatch.setattr(server, "ServerThread", FirstRequestAtOnce)
    previous = {signum: signal.getsignal(signum) for signum in (signal.SIGTERM, signal.SIGINT)}
    try:
        server.serve(scheduler, create_app(scheduler, manage_scheduler=False), "127.0.0.1", free_port(), 5)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    assert seen == [True, "queued"], seen


def test_adaflash_serve_as_a_process_answers_a_real_client_and_stops_on_sigterm(tmp_path):
    """The CLI as a user starts it: engine in the main thread, uvicorn beside it, the key from ADAFLASH_API_KEY.
    SIGTERM drains it: /health and new requests get 503 with Retry-After, the request in flight streams to its
    end, and the process exits 0."""
    import os
    import signal
    import socket
    import subprocess
    import sys
    import threading

    import httpx

    target, drafter, tokenizer = tiny_chat_models(max_positions=256)
    target.save_pretrained(tmp_path / "target")
    tokenizer.save_pretrained(tmp_path / "target")
    drafter.save_pretrained(tmp_path / "drafter")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    key, url = "e2e-key", f"http://127.0.0.1:{port}"
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "adaflash_hf.cli",
            "serve",
            "--target",
            str(tmp_path / "target"),
            "--drafter",
            str(tmp_path / "drafter"),
            "--dtype",
            "fp32",
            "--port",
            str(port),
            "--served-model-name",
            "tiny",
            "--drain-timeout",
            "60",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "TOKENIZERS_PARALLELISM": "false", "ADAFLASH_API_KEY": key},
    )
    try:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0)
        deadline = time.time() + 120
        while True:
            try:
                client.models.list()
                break
            except openai.APIConnectionError:
                assert process.poll() is None, process.stdout.read()
                assert time.time() < deadline, "the server did not come up within 120 s"
                time.sleep(0.2)
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=f"{url}/v1", api_key="wrong", max_retries=0).models.list()
        prompt = [5, 17, 33, 8, 21]
        reply = client.completions.create(model="tiny", prompt=prompt, max_tokens=12, temperature=0)
        assert reply.choices[0].text == reference_text(target, tokenizer, prompt, 12)

        long_prompt, streamed, started = [9, 40, 41, 12], [], threading.Event()

        def in_flight():  # a long request that is streaming when the signal comes
            for chunk in client.completions.create(
                model="tiny", prompt=long_prompt, max_tokens=240, temperature=0, stream=True
            ):
                streamed.append(chunk)
                started.set()

        reader = threading.Thread(target=in_flight)
        reader.start()
        assert started.wait(60)
        process.send_signal(signal.SIGTERM)
        while (health := httpx.get(f"{url}/health", timeout=10)).status_code == 200:
            time.sleep(0.01)
        assert health.status_code == 503 and health.json()["status"] == "draining"
        refused = httpx.post(
            f"{url}/v1/completions",
            json={"model": "tiny", "prompt": prompt, "max_tokens": 4},
            headers={"Authorization": f"Bearer {key}"},
            timeout=10,
        )
        assert refused.status_code == 503 and int(refused.headers["Retry-After"]) >= 1
        assert refused.json()["error"]["code"] == "shutting_down"
        assert not any(c.choices[0].finish_reason for c in streamed if c.choices), "still streaming when refused"
        reader.join(60)
        text = "".join(c.choices[0].text for c in streamed if c.choices)
        assert text == reference_text(target, tokenizer, long_prompt, 240)
        assert streamed[-1].choices[0].finish_reason in ("length", "stop")
        output, _ = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 0, output
    assert "Traceback" not in output and "stopping" in output and "draining" in output


def test_the_concurrency_bench_runs_end_to_end_with_repeats(tmp_path, capsys):
    """`adaflash bench --concurrency` on a local model folder and a prompt file: one row per method and level whose
    throughput is all passes' tokens over their time, with every pass's rate listed; the methods interleave pass by
    pass, and every row carries its passes and bootstrap intervals paired by pass."""
    import json

    from adaflash_hf.cli import main

    target, drafter, tokenizer = tiny_chat_models(max_positions=256)
    target.save_pretrained(tmp_path / "target")
    tokenizer.save_pretrained(tmp_path / "target")
    drafter.save_pretrained(tmp_path / "drafter")
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(
        "".join(
            json.dumps({"prompt": f"hello {i} world", "domain": "chat" if i % 2 else "code"}) + "\n" for i in range(8)
        )
    )
    out = tmp_path / "concurrency.json"
    threads = torch.get_num_threads()
    code = main(
        [
            "bench",
            "--concurrency",
            "1,2",
            "--target",
            str(tmp_path / "target"),
            "--drafter",
            str(tmp_path / "drafter"),
            "--prompts",
            str(prompts),
            "--methods",
            "plain,adaflash@2,adaflash",
            "--requests",
            "3",
            "--repeats",
            "2",
            "--max-new-tokens",
            "4",
            "--dtype",
            "fp32",
            "--num-threads",
            "1",
            "--json",
            str(out),
            "--plot",
            "",
            "--round-log",
            str(tmp_path / "rounds.jsonl"),
        ]
    )
    torch.set_num_threads(threads)
    assert code == 0
    payload = json.loads(out.read_text())
    results = payload["results"]
    assert payload["intervals"]["confidence"] == 0.95 and payload["intervals"]["min_passes"] == 2
    rounds = [json.loads(line) for line in (tmp_path / "rounds.jsonl").read_text().splitlines()]
    assert {r["method"] for r in rounds} == {"adaflash"}  # the adaptive policy's rounds; a fixed length has no guard
    assert {(r["concurrency"], r["pass"]) for r in rounds} >= {(c, p) for c in (1, 2) for p in ("warmup", 0, 1)}
    assert all(r["rows"] >= 1 and r["tokens"] >= 1 and r["steps"] > 0 and isinstance(r["held"], bool) for r in rounds)
    assert [(r["method"], r["concurrency"]) for r in results] == [
        (m, c) for c in (1, 2) for m in ("plain", "adaflash@2", "adaflash")
    ]
    for row in results:
        assert row["repeats"] == 2 and row["num_requests"] == 6 and len(row["tokens_per_second_passes"]) == 2
        low, high = sorted(row["tokens_per_second_passes"])
        assert low <= row["tokens_per_second"] <= high  # tokens over time of both passes lies between their rates
        assert {"p50_latency_s", "p99_latency_s", "ttft_p50_s", "mean_accepted_length", "peak_rss_mb"} <= row.keys()
        requests = row["requests"]  # one record per request, for the tails' causes
        assert sorted(r["pass"] for r in requests) == [0, 0, 0, 1, 1, 1]
        assert sum(r["tokens"] for r in requests) == row["output_tokens"] and all(r["rounds"] >= 1 for r in requests)
        assert max(r["latency_s"] for r in requests) >= row["p99_latency_s"]
    methods = ["plain", "adaflash@2", "adaflash"]
    for level, concurrency in enumerate((1, 2)):  # interleaved: every method's pass 1 before any method's pass 2
        rows = [r for r in results if r["concurrency"] == concurrency]
        runs = sorted((p["started_s"], p["pass"], p["position"], r["method"]) for r in rows for p in r["passes"])
        assert [(index, position) for _, index, position, _ in runs] == [(i, k) for i in range(2) for k in range(3)]
        for index in range(2):  # each pass runs every method once, the order rotated from pass to pass
            turn = (level + index) % 3
            assert [m for _, i, _, m in runs if i == index] == methods[turn:] + methods[:turn]
        for row in rows:
            assert [p["tokens_per_second"] for p in row["passes"]] == pytest.approx(row["tokens_per_second_passes"])
            assert all(
                {"p50_latency_s", "p99_latency_s", "ttft_p50_s", "output_tokens"} <= p.keys() for p in row["passes"]
            )
            assert row["best_fixed"] == "adaflash@2"
            intervals = row["intervals"]
            assert set(intervals) == {"tokens_per_second", "vs_plain", "vs_best_fixed", "p99_latency_s", "p99_vs_plain"}
            for interval in intervals.values():
                assert interval["low"] <= interval["estimate"] <= interval["high"]
            assert intervals["p99_latency_s"]["estimate"] == row["p99_latency_s"]
        plain = next(r for r in rows if r["method"] == "plain")
        assert plain["intervals"]["vs_plain"] == {"estimate": 1.0, "low": 1.0, "high": 1.0}
    captured = capsys.readouterr()
    assert "pass 2/2" in captured.err
    assert "vs plain [95%]" in captured.out and "bootstrap over 2 interleaved passes" in captured.out
    with pytest.raises(ValueError, match="at least 5 prompts"):
        prompts.write_text('{"prompt": "one", "domain": "chat"}\n')
        main(
            ["bench", "--concurrency", "1", "--target", str(tmp_path / "target"), "--prompts", str(prompts), "--debug"]
        )


def test_the_row_slowdown_bound_reaches_served_policies_from_serve_and_the_bench():
    from adaflash_hf.decoding.policy import GoodputVerifyLength
    from adaflash_hf.policies import adaptive_policy
    from adaflash_hf.serve import ServeArgs
    from adaflash_hf.serving.loadtest import ConcurrencyBenchArgs, make_scheduler, row_slowdown

    assert [row_slowdown(m) for m in ("adaflash~1.05", "adaflash~1", "adaflash~0.9", "adaflash~x", "plain~2")] == [
        1.05,
        1.0,
        None,
        None,
        None,
    ]
    ConcurrencyBenchArgs(methods="plain,adaflash,adaflash~1.05")
    for bad in ("adaflash~0.5", "adaflash~fast", "plain~1.1"):
        with pytest.raises(ValueError, match=r"adaflash~S \(S >= 1\)"):
            ConcurrencyBenchArgs(methods=f"plain,{bad}")
    target, drafter, tokenizer = tiny_chat_models(max_positions=256)
    bounded = make_scheduler("adaflash~1.05", target, drafter, tokenizer, max_batch_size=4)
    default = make_scheduler("adaflash", target, drafter, tokenizer, max_batch_size=4)
    assert bounded.batch.policy.max_row_slowdown == 1.05 and bounded.batch.policy.row_slack
    assert getattr(default.batch.policy, "max_row_slowdown", None) is None
    policy = adaptive_policy(None, max_row_slowdown=1.1)  # no drafter: the engine's goodput policy, bounded
    assert isinstance(policy, GoodputVerifyLength) and policy.max_row_slowdown == 1.1
    with pytest.raises(ValueError, match="factor >= 1"):
        adaptive_policy(None, max_row_slowdown=0.8)
    with pytest.raises(ValueError, match="--max-row-slowdown 0.5: give a factor >= 1"):
        ServeArgs(max_row_slowdown=0.5)
    with pytest.raises(ValueError, match="no --verify-len"):
        ServeArgs(max_row_slowdown=1.05, verify_len=4)
