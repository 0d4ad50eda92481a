"""What an operator sees from ``adaflash serve --api-key K --max-queue 8``: auth, metrics, overload, drain, memory.

Starts the server as a user would (a process of its own, the CLI, a free port on 127.0.0.1), then checks:

1. ``auth``: ``/v1/models`` and a chat completion answer 401 without the key and with a wrong one, 200 with it;
   ``/health`` answers without a key;
2. ``metrics``: ``/metrics`` parses as Prometheus text and carries the request, token and acceptance metrics;
3. ``floods``: ``--floods`` rounds of ``--flood`` concurrent completions each get only 200s and 429s, every 429
   with ``Retry-After``; the server's RSS after each flood (once idle) stays within 10 % + 50 MiB of its RSS
   after the first flood;
4. ``disconnect``: a client that drops a stream after a few chunks is counted as cancelled, the engine is idle
   again, and the next request is served in full;
5. ``drain``: SIGTERM while a request streams: new requests get 503 with ``Retry-After``, the streaming request
   ends with its ``finish_reason`` and ``[DONE]``, and the process exits 0.

It prints one line per check and writes JSON (with provenance) that ``make_tables.py`` renders as
``serving_deployment``::

    python benchmarks/serving/deployment.py --json benchmarks/serving/deployment-smollm2-135m.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REQUIRED_METRICS = (
    "adaflash_requests",
    "adaflash_prompt_tokens",
    "adaflash_generation_tokens",
    "adaflash_request_latency_seconds",
    "adaflash_time_to_first_token_seconds",
    "adaflash_time_per_output_token_seconds",
    "adaflash_requests_running",
    "adaflash_requests_waiting",
    "adaflash_batch_size",
    "adaflash_accepted_tokens_per_round",
    "adaflash_draft_tokens_proposed",
    "adaflash_draft_tokens_accepted",
)
PROMPTS = (  # chat requests that draw long answers, so streams last long enough to drop or drain
    "Write a detailed tutorial on Python list comprehensions, with many examples.",
    "Explain step by step how to solve quadratic equations, with three worked examples.",
    "Write a long story about a lighthouse keeper who finds a message in a bottle.",
    "Describe in detail how a web browser loads a page, from typing the address to rendering.",
)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def rss_mb(pid: int) -> float:
    """Resident memory of process ``pid`` in MiB (Linux /proc)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for process {pid}")


class Server:
    """``adaflash serve`` in a process of its own; its output goes to ``log``."""

    def __init__(self, args: argparse.Namespace, log: Path):
        self.port, self.key, self.model = free_port(), args.api_key, None
        self.url = f"http://127.0.0.1:{self.port}"
        command = [sys.executable, "-m", "adaflash_hf.cli", "serve", "--target", args.target, "--dtype", args.dtype]
        command += ["--port", str(self.port), "--api-key", self.key, "--max-queue", str(args.max_queue)]
        command += ["--max-batch-size", str(args.max_batch_size), "--drain-timeout", "120"]
        self.command = " ".join(command[1:]).replace("-m adaflash_hf.cli", "adaflash").replace(self.key, "K")
        self.log = log.open("w")
        env = {**os.environ, "TOKENIZERS_PARALLELISM": "false"}
        self.process = subprocess.Popen(command, stdout=self.log, stderr=subprocess.STDOUT, env=env)

    @property
    def headers(self) -> dict:
        return {"Authorization": f"Bearer {self.key}"}

    def wait_ready(self, http, timeout: float = 600) -> float:
        start = time.perf_counter()
        while time.perf_counter() - start < timeout:
            if self.process.poll() is not None:
                raise RuntimeError(f"adaflash serve exited with {self.process.returncode}: see {self.log.name}")
            try:
                if http.get(f"{self.url}/health", timeout=5).status_code == 200:
                    return time.perf_counter() - start
            except Exception:  # not listening yet
                pass
            time.sleep(0.5)
        raise RuntimeError(f"adaflash serve did not answer /health within {timeout:.0f} s: see {self.log.name}")

    def body(self, i: int, max_tokens: int, stream: bool = False) -> dict:
        messages = [{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}]
        return {"model": self.model, "messages": messages, "max_tokens": max_tokens, "temperature": 0, "stream": stream}


def check_auth(server: Server, http) -> dict:
    completion = server.body(0, 8)
    statuses = {
        "health_without_key": http.get(f"{server.url}/health").status_code,
        "models_without_key": http.get(f"{server.url}/v1/models").status_code,
        "models_wrong_key": http.get(f"{server.url}/v1/models", headers={"Authorization": "Bearer wrong"}).status_code,
        "models_with_key": http.get(f"{server.url}/v1/models", headers=server.headers).status_code,
        "completion_without_key": http.post(f"{server.url}/v1/chat/completions", json=completion).status_code,
        "completion_wrong_key": http.post(
            f"{server.url}/v1/chat/completions", json=completion, headers={"Authorization": "Bearer wrong"}
        ).status_code,
        "completion_with_key": http.post(
            f"{server.url}/v1/chat/completions", json=completion, headers=server.headers
        ).status_code,
    }
    unauthorized = [k for k in statuses if "without" in k or "wrong" in k]
    passed = all(statuses[k] == 401 for k in unauthorized if not k.startswith("health"))
    passed &= statuses["health_without_key"] == 200 and statuses["models_with_key"] == 200
    passed &= statuses["completion_with_key"] == 200
    return {"statuses": statuses, "passed": passed}


def scrape(server: Server, http) -> dict[str, dict]:
    """``/metrics`` as {family: {sample name and labels: value}}; raises if it is not Prometheus text."""
    from prometheus_client.parser import text_string_to_metric_families

    response = http.get(f"{server.url}/metrics")
    response.raise_for_status()
    families = {}
    for family in text_string_to_metric_families(response.text):
        families[family.name] = {
            s.name + json.dumps(s.labels, sort_keys=True) if s.labels else s.name: s.value for s in family.samples
        }
    return families


def check_metrics(server: Server, http) -> dict:
    families = scrape(server, http)
    missing = [name for name in REQUIRED_METRICS if name not in families]
    proposed = sum(families.get("adaflash_draft_tokens_proposed", {}).values())
    generated = families.get("adaflash_generation_tokens", {}).get("adaflash_generation_tokens_total", 0)
    return {
        "families": len(families),
        "missing": missing,
        "generation_tokens_total": generated,
        "draft_tokens_proposed_total": proposed,
        "passed": not missing and generated > 0 and proposed > 0,
    }


async def flood(server: Server, n: int, max_tokens: int) -> list[tuple[int, str | None, int]]:
    """``n`` completions at once: (status, Retry-After, completion tokens) each."""
    import httpx

    limits = httpx.Limits(max_connections=n + 8)
    async with httpx.AsyncClient(timeout=600, limits=limits, headers=server.headers) as client:
        responses = await asyncio.gather(
            *(client.post(f"{server.url}/v1/chat/completions", json=server.body(i, max_tokens)) for i in range(n))
        )
    return [
        (
            r.status_code,
            r.headers.get("Retry-After"),
            r.json()["usage"]["completion_tokens"] if r.status_code == 200 else 0,
        )
        for r in responses
    ]


def wait_idle(server: Server, http, timeout: float = 60) -> None:
    deadline = time.perf_counter() + timeout
    while time.perf_counter() < deadline:
        families = scrape(server, http)
        if not families["adaflash_requests_running"]["adaflash_requests_running"]:
            if not families["adaflash_requests_waiting"]["adaflash_requests_waiting"]:
                return
        time.sleep(0.2)
    raise RuntimeError(f"the engine still had requests {timeout:.0f} s after the last client finished")


def check_floods(server: Server, http, args: argparse.Namespace) -> dict:
    floods = []
    for i in range(args.floods):
        start = time.perf_counter()
        answers = asyncio.run(flood(server, args.flood, args.max_tokens))
        seconds = time.perf_counter() - start
        wait_idle(server, http)
        time.sleep(6)  # the engine hands freed heap back at most every 5 s after a request finishes
        statuses = [a[0] for a in answers]
        floods.append(
            {
                "seconds": round(seconds, 1),
                "ok": statuses.count(200),
                "rate_limited": statuses.count(429),
                "other": sorted(s for s in statuses if s not in (200, 429)),
                "429_without_retry_after": sum(1 for s, retry, _ in answers if s == 429 and not retry),
                "short_outputs": sum(1 for s, _, n in answers if s == 200 and n < 1),
                "rss_mb": round(rss_mb(server.process.pid), 1),
            }
        )
        print(f"[deployment] flood {i + 1}/{args.floods}: {floods[-1]}", flush=True)
    first = floods[0]["rss_mb"]
    growth = max(f["rss_mb"] for f in floods) - first
    allowed = 0.1 * first + 50
    clean = all(not f["other"] and not f["429_without_retry_after"] and not f["short_outputs"] for f in floods)
    return {
        "floods": floods,
        "rss_growth_mb": round(growth, 1),
        "allowed_mb": round(allowed, 1),
        "passed": clean and all(f["ok"] > 0 for f in floods) and growth <= allowed,
    }


def check_disconnect(server: Server, http) -> dict:
    import httpx

    cancelled = "adaflash_requests_total" + json.dumps({"outcome": "cancelled"})
    before = scrape(server, http)["adaflash_requests"].get(cancelled, 0)
    chunks = 0
    with httpx.Client(timeout=120, headers=server.headers) as client:
        body = server.body(1, 400, stream=True)
        with client.stream("POST", f"{server.url}/v1/chat/completions", json=body) as response:
            for line in response.iter_lines():
                chunks += line.startswith("data: ")
                if chunks >= 3:
                    break  # leaving the block closes the connection mid-stream
    wait_idle(server, http, timeout=30)
    after = scrape(server, http)["adaflash_requests"].get(cancelled, 0)
    reply = http.post(f"{server.url}/v1/chat/completions", json=server.body(2, 32), headers=server.headers)
    tokens = reply.json()["usage"]["completion_tokens"] if reply.status_code == 200 else 0
    return {
        "chunks_read": chunks,
        "cancelled_counted": after - before,
        "next_status": reply.status_code,
        "next_completion_tokens": tokens,
        "passed": after - before == 1 and reply.status_code == 200 and tokens > 0,
    }


def check_drain(server: Server, http) -> dict:
    import httpx

    events, started = [], threading.Event()

    def in_flight():
        with (
            httpx.Client(timeout=300, headers=server.headers) as client,
            client.stream(
                "POST", f"{server.url}/v1/chat/completions", json=server.body(3, 192, stream=True)
            ) as response,
        ):
            for line in response.iter_lines():
                if line.startswith("data: "):
                    events.append(line.removeprefix("data: "))
                    started.set()

    reader = threading.Thread(target=in_flight)
    reader.start()
    started.wait(120)
    server.process.send_signal(signal.SIGTERM)
    refused = None
    deadline = time.perf_counter() + 30
    while time.perf_counter() < deadline and reader.is_alive():
        response = http.post(f"{server.url}/v1/chat/completions", json=server.body(0, 4), headers=server.headers)
        if response.status_code == 503:
            refused = {"status": 503, "retry_after": response.headers.get("Retry-After")}
            break
        time.sleep(0.05)
    reader.join(300)
    try:
        code = server.process.wait(timeout=180)
    except subprocess.TimeoutExpired:
        server.process.kill()
        code = None
    finish = None
    if len(events) >= 2 and events[-1] == "[DONE]":
        finish = json.loads(events[-2])["choices"][0]["finish_reason"]
    return {
        "refused_while_draining": refused,
        "events": len(events),
        "finish_reason": finish,
        "exit_code": code,
        "passed": bool(refused and refused["retry_after"]) and finish in ("length", "stop") and code == 0,
    }


def provenance(args: argparse.Namespace, command: str) -> dict:
    from adaflash_hf.provenance import script_provenance

    command_line = "python benchmarks/serving/deployment.py " + " ".join(sys.argv[1:])
    return {**script_provenance(command_line, args.machine_note), "server": command}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--target", default="smollm2-135m", help="Target preset, folder or Hub id.")
    parser.add_argument("--dtype", default="bf16", choices=("auto", "bf16", "fp32"))
    parser.add_argument("--api-key", default="deployment-check-key", help="The key the server is started with.")
    parser.add_argument("--max-queue", type=int, default=8)
    parser.add_argument("--max-batch-size", type=int, default=8)
    parser.add_argument("--flood", type=int, default=48, help="Concurrent requests per flood.")
    parser.add_argument("--floods", type=int, default=5, help="Floods; RSS after each is compared with the first.")
    parser.add_argument("--max-tokens", type=int, default=32, help="New tokens per flood request.")
    parser.add_argument("--json", default=str(HERE / "deployment-smollm2-135m.json"))
    parser.add_argument("--machine-note", default="", help="Appended to the machine in the provenance.")
    parser.add_argument("--log", default=str(Path(tempfile.gettempdir()) / "adaflash-deployment-serve.log"))
    args = parser.parse_args(argv)
    try:
        import httpx
        import prometheus_client  # noqa: F401
    except ImportError as error:
        parser.error(f"{error.name} is missing: pip install -e '.[serve,dev]'")

    output = Path(args.json)
    server = Server(args, Path(args.log))
    results: dict = {}
    try:
        with httpx.Client(timeout=600) as http:
            results["startup_seconds"] = round(server.wait_ready(http), 1)
            server.model = http.get(f"{server.url}/v1/models", headers=server.headers).json()["data"][0]["id"]
            for name, check in (
                ("auth", lambda: check_auth(server, http)),
                ("metrics", lambda: check_metrics(server, http)),
                ("floods", lambda: check_floods(server, http, args)),
                ("disconnect", lambda: check_disconnect(server, http)),
                ("drain", lambda: check_drain(server, http)),
            ):
                results[name] = check()
                print(f"[deployment] {name}: {'passed' if results[name]['passed'] else 'FAILED'}", flush=True)
    finally:
        if server.process.poll() is None:
            server.process.kill()
        server.log.close()
    results["passed"] = all(results[k]["passed"] for k in ("auth", "metrics", "floods", "disconnect", "drain"))
    report = {"provenance": provenance(args, server.command), "settings": vars(args), **results}
    for private in ("api_key", "log", "json"):
        report["settings"].pop(private)
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(report, indent=2) + "\n")
    print(f"[deployment] {'PASSED' if results['passed'] else 'FAILED'}; wrote {output} (server log {server.log.name})")
    return 0 if results["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
