"""``adaflash bench --concurrency``: drive the served engine over HTTP at several concurrencies.

Every method gets its own scheduler and OpenAI-compatible server in this process (one target model
shared by all), and a closed-loop client keeps ``c`` streaming chat requests in flight. Methods:
``plain`` (continuous batching, no drafting), ``adaflash@N`` (every row verifies N tokens: the anchor
plus N - 1 drafts), and ``adaflash`` (the library default: the verify length that maximises expected
tokens per second at the current load, measured on this machine). Methods are interleaved: each measured
pass of a level runs every method once, back to back (the order rotating from pass to pass and level to
level), so drift in a shared machine hits all methods alike. With ``--repeats`` of 2 or more, every row
keeps its passes and bootstrap 95 % intervals over them, paired by pass (:mod:`.intervals`). Before each
level every method serves that level's first ``c`` prompts once, unmeasured and short, so one-off costs
of a new batch size land in none of the measured requests.

As in ``adaflash serve``, the engine being measured runs in the main thread (the one that loaded the
model) and the HTTP servers and the client in background threads: one OS thread does all torch work.
"""

from __future__ import annotations

import asyncio
import json
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ..cli_args import (
    DTYPES,
    check_choice,
    domains_field,
    drafter_field,
    dtype_field,
    json_field,
    num_threads_field,
    target_field,
)
from ..provenance import machine_summary
from .loadtest_report import add_intervals, interval_settings, pass_summary, plot_throughput, print_table, summarise

METHODS = ("plain", "adaflash")
LEVEL_WARMUP_TOKENS = 16  # max_tokens of the unmeasured requests every method serves before each level
PROMPT_SETS = ("eval", "tuning", "validation")  # --prompts: the held-out prompts, or one half of them


@dataclass
class ConcurrencyBenchArgs:
    target: str = target_field("smollm2-135m")
    drafter: str = drafter_field()
    concurrency: str = field(
        default="1,4,8,16,32", metadata={"help": "Comma-separated numbers of requests kept in flight."}
    )
    methods: str = field(
        default="plain,adaflash@16,adaflash@4,adaflash",
        metadata={
            "help": "Comma-separated: plain, adaflash (adaptive default), adaflash@N (fixed verify length N), "
            "adaflash~S (adaptive, no request at plain pace more than S times slower than plain, e.g. 1.05)."
        },
    )
    requests: int = field(
        default=0, metadata={"help": "Requests per method and level (0: twice the concurrency, at least 16)."}
    )
    repeats: int = field(
        default=1,
        metadata={
            "help": "Measured passes per method and level, the methods interleaved in each "
            "(throughput: all passes' tokens over their time; latencies pooled); 2 or more add bootstrap 95 % "
            "intervals over the passes (a claim on a 2-core machine needs 5+)."
        },
    )
    max_new_tokens: int = field(default=64, metadata={"help": "max_tokens of every request."})
    domains: str = domains_field("code,math,chat,news")
    prompts: str = field(
        default="eval",
        metadata={
            "help": "'eval' (the preset's held-out prompts of --domains), one half of them by document, "
            "'tuning' (where the serving policy's constants are tuned) or 'validation' (where claims about them are "
            "checked), or a JSONL file of {prompt, domain} lines (at least 5 prompts)."
        },
    )
    dtype: str = dtype_field()
    num_threads: int | None = num_threads_field()
    json: str = json_field("bench_concurrency.json")
    plot: str = field(
        default="bench_concurrency.png", metadata={"help": "Throughput against concurrency plot ('' to skip)."}
    )
    round_log: str = field(
        default="",
        metadata={
            "help": "A JSONL file to write every round of the adaptive method to, as its throughput guard sees it "
            "(method, level, pass, rows, tokens per row, plain steps' time, ...): the input of "
            "benchmarks/profile/guard_replay.py, which compares guard rules on it offline ('' to skip)."
        },
    )

    def __post_init__(self):
        levels = self.levels
        if not levels or min(levels) < 1:
            raise ValueError(f"--concurrency {self.concurrency!r}: give positive integers, e.g. 1,4,8,16,32.")
        for method in self.method_list:
            base, _, n = method.partition("@")
            if (
                base not in METHODS
                and row_slowdown(base) is None
                or (n and (base != "adaflash" or not n.isdigit() or int(n) < 1))
                or (base == "plain" and n)
            ):
                raise ValueError(
                    f"method {method!r}: choose from plain, adaflash, adaflash@N (N >= 1), adaflash~S (S >= 1)."
                )
        if self.requests < 0 or self.max_new_tokens < 1 or self.repeats < 1:
            raise ValueError("--requests must be >= 0, --max-new-tokens >= 1 and --repeats >= 1.")
        check_choice("--dtype", self.dtype, DTYPES)
        if self.prompts not in PROMPT_SETS and not Path(self.prompts).is_file():
            raise FileNotFoundError(
                f"--prompts {self.prompts}: no such file; give 'eval' (the held-out preset prompts), 'tuning' or "
                "'validation' (its two halves) or a JSONL file of {prompt, domain} lines."
            )

    @property
    def levels(self) -> list[int]:
        try:
            return [int(c) for c in self.concurrency.split(",") if c.strip()]
        except ValueError:
            return []

    @property
    def method_list(self) -> list[str]:
        return [m.strip() for m in self.methods.split(",") if m.strip()]


def row_slowdown(method: str) -> float | None:
    """S of ``adaflash~S``: the adaptive default with the row slowdown bound S (``--max-row-slowdown`` of serve)."""
    name, sep, factor = method.partition("~")
    try:
        value = float(factor) if name == "adaflash" and sep else None
    except ValueError:
        return None
    return value if value is not None and value >= 1 else None


def make_scheduler(method: str, target, drafter, tokenizer, max_batch_size: int, target_name: str | None = None):
    """The scheduler a method is served with (its own drafting state, so methods learn independently)."""
    from ..decoding.config import DraftingConfig
    from ..decoding.drafting_state import DraftingState
    from ..decoding.policy import FixedVerifyLength
    from .scheduler import Scheduler, SchedulerConfig

    config = SchedulerConfig(max_batch_size=max_batch_size, max_queue=max(256, 4 * max_batch_size))
    base, _, n = method.partition("@")
    if base == "plain":
        drafting = DraftingConfig(drafter=False, global_index=False, datastore=False)
        return Scheduler(
            target,
            None,
            tokenizer,
            config,
            drafting=drafting,
            drafting_state=DraftingState(drafting),
            verify_policy=FixedVerifyLength(1),
            model_name=method,
        )
    from ..policies import adaptive_policy

    policy = FixedVerifyLength(int(n)) if n else adaptive_policy(drafter, "auto", target_name, row_slowdown(base))
    return Scheduler(
        target, drafter, tokenizer, config, drafting_state=DraftingState(), verify_policy=policy, model_name=method
    )


def peak_rss_mb() -> float:
    """This process's current resident memory in MB (Linux /proc; 0 where unavailable)."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


REQUEST_FIELDS = ("latency_s", "ttft_s", "queue_wait_s", "tokens", "rounds", "mean_accepted_length", "finish_reason")


async def stream_request(client, url: str, model: str, prompt: str, max_tokens: int) -> dict:
    """One streaming chat request; returns its latency, time to first token, tokens and server metrics."""
    body = {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    start = time.perf_counter()
    ttft, tokens, extra, reason = None, 0, {}, None
    async with client.stream("POST", f"{url}/v1/chat/completions", json=body) as response:
        if response.status_code != 200:
            raise RuntimeError(f"server answered {response.status_code}: {(await response.aread())[:300]!r}")
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            for choice in chunk.get("choices") or ():
                if ttft is None and (choice.get("delta") or {}).get("content"):
                    ttft = time.perf_counter() - start
                reason = choice.get("finish_reason") or reason
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
            extra = chunk.get("adaflash") or extra
    return {
        "latency_s": time.perf_counter() - start,
        "ttft_s": ttft,
        "tokens": tokens,
        "finish_reason": reason,
        "queue_wait_s": extra.get("queue_wait_s"),
        "rounds": extra.get("rounds"),
        "mean_accepted_length": extra.get("mean_accepted_length"),
    }


async def drive(
    url: str, model: str, prompts: list[str], concurrency: int, max_tokens: int
) -> tuple[list[dict], float, float]:
    """Keep ``concurrency`` requests in flight until every prompt is answered; (records, seconds, peak RSS MB)."""
    import httpx

    todo = list(prompts)
    records: list[dict] = []
    peak = peak_rss_mb()
    done = asyncio.Event()

    async def sample_memory():
        nonlocal peak
        while not done.is_set():
            peak = max(peak, peak_rss_mb())
            await asyncio.sleep(0.1)

    async def worker(client):
        while todo:
            records.append(await stream_request(client, url, model, todo.pop(0), max_tokens))

    limits = httpx.Limits(max_connections=concurrency + 4, max_keepalive_connections=concurrency + 4)
    async with httpx.AsyncClient(timeout=httpx.Timeout(600.0), limits=limits) as client:
        sampler = asyncio.create_task(sample_memory())
        start = time.perf_counter()
        await asyncio.gather(*(worker(client) for _ in range(concurrency)))
        seconds = time.perf_counter() - start
        done.set()
        await sampler
    return records, seconds, peak


def serve_while(scheduler, client, *args):
    """Run ``scheduler``'s engine in this thread while ``asyncio.run(client(*args))`` runs in another;
    return its result.

    The engine stops when the client returns (or raises, re-raised here)."""
    box: dict = {}

    def run_client():
        try:
            if not scheduler.wait_until_running(600):
                raise RuntimeError("the engine did not start within 600 s")
            box["value"] = asyncio.run(client(*args))
        except BaseException as error:  # handed to the engine's thread
            box["error"] = error
        finally:
            scheduler.stop()

    thread = threading.Thread(target=run_client, name="adaflash-bench-client", daemon=True)
    thread.start()
    try:
        scheduler.run()
    finally:
        scheduler.stop()
        thread.join(60)
    if "error" in box:
        raise box["error"]
    return box["value"]


def bench_prompts(args: ConcurrencyBenchArgs) -> list[str]:
    """The prompts of every level: the eval split of ``--domains`` or the ``--prompts`` file, domains interleaved
    and every prompt used (not cut to the smallest domain). The last four are the warm-up's alone."""
    from ..data import eval_half, load_prompts, load_prompts_jsonl

    by_domain: dict[str, list[str]] = {}
    if args.prompts in PROMPT_SETS:
        for domain in args.domains.split(","):
            rows = load_prompts(domain.strip(), split="eval").to_list()
            keep = [args.prompts == "eval" or eval_half(r["source"], r["doc_id"]) == args.prompts for r in rows]
            by_domain[domain.strip()] = [r["prompt"] for r, k in zip(rows, keep) if k]
    else:
        for row in load_prompts_jsonl(args.prompts).to_list():
            by_domain.setdefault(row.get("domain") or "all", []).append(row["prompt"])
    groups = list(by_domain.values())
    mixed = [group[i] for i in range(max(map(len, groups), default=0)) for group in groups if i < len(group)]
    if len(mixed) < 5:
        raise ValueError(
            f"the concurrency benchmark needs at least 5 prompts (4 warm it up), got {len(mixed)}"
            + (f" in {args.prompts}." if args.prompts not in PROMPT_SETS else f" in the {args.prompts} prompts.")
        )
    return mixed


def _round_writer(file, method: str, where: dict):
    """A policy's ``round_log``: one JSON line per round, with the method and the level and pass it served."""

    def write(record: dict) -> None:
        file.write(json.dumps({"method": method, **where, **record}) + "\n")

    return write


def run_concurrency_bench(args: ConcurrencyBenchArgs) -> int:
    import torch

    from ..drafters import load_drafter
    from ..provenance import code_provenance
    from ..targets import load_target
    from .app import create_app
    from .server import ServerThread

    mixed = bench_prompts(args)  # before the models load: a bad prompt file fails at once
    if args.num_threads:
        torch.set_num_threads(args.num_threads)
    target, tokenizer = load_target(args.target, dtype=args.dtype)
    drafter = load_drafter(args.drafter, target, target_name=args.target)
    levels, methods = args.levels, args.method_list
    schedulers = {m: make_scheduler(m, target, drafter, tokenizer, max(levels), args.target) for m in methods}
    where = {"concurrency": None, "pass": "warmup"}  # what the round log files rounds under
    round_log = open(args.round_log, "w") if args.round_log else None  # noqa: SIM115 (closed in finally)
    if round_log is not None:
        for method, scheduler in schedulers.items():
            if hasattr(scheduler.batch.policy, "round_log"):  # the adaptive policy (a fixed length has no guard)
                scheduler.batch.policy.round_log = _round_writer(round_log, method, where)
    results = []
    print(
        f"[bench] {args.target} ({target.dtype}), drafter block {drafter.config.block_size}, "
        f"{torch.get_num_threads()} threads; levels {levels}; methods {methods}",
        file=sys.stderr,
    )
    servers = {}
    try:
        for method, scheduler in schedulers.items():  # the engines run one at a time, in this thread (serve_while)
            servers[method] = ServerThread(create_app(scheduler, manage_scheduler=False))
        urls = {m: s.__enter__() for m, s in servers.items()}
        for method in methods:  # warm-up (and the verify-cost profile): first calls pay one-off costs
            serve_while(schedulers[method], drive, urls[method], method, mixed[-4:], 2, 16)
        offset, clock = 0, time.perf_counter()  # passes record their start relative to clock
        for level, concurrency in enumerate(levels):
            where["concurrency"], where["pass"] = concurrency, "warmup"  # this level's unmeasured requests first
            count = args.requests or max(16, 2 * concurrency)
            prompts = [mixed[(offset + i) % (len(mixed) - 4)] for i in range(count)]
            offset += count
            for method in methods:  # unmeasured: one-off costs of this batch size (kernel set-up for new shapes, the
                # guard's first rounds at it) do not land in a level of 16-64 requests, as they would not in a server
                serve_while(
                    schedulers[method],
                    drive,
                    urls[method],
                    method,
                    prompts[:concurrency],
                    concurrency,
                    LEVEL_WARMUP_TOKENS,
                )
            passes: dict[str, list] = {m: [] for m in methods}
            for repeat in range(args.repeats):
                where["pass"] = repeat
                for scheduler in schedulers.values():  # no pass reuses the warm-up's or an earlier pass's outputs
                    scheduler.drafting_state.forget_requests()
                turn = (level + repeat) % len(methods)
                for position, method in enumerate(methods[turn:] + methods[:turn]):  # rotated: no method always first
                    before = schedulers[method].status()
                    started = time.perf_counter() - clock
                    records, seconds, peak = serve_while(
                        schedulers[method], drive, urls[method], method, prompts, concurrency, args.max_new_tokens
                    )
                    after = schedulers[method].status()
                    one = summarise(method, concurrency, records, seconds, peak, before, after)
                    passes[method].append(
                        (records, seconds, peak, before, after, pass_summary(repeat, position, started, one))
                    )
                    print(
                        f"[bench] c={concurrency:<3} {method:<12} {one['tokens_per_second']:7.1f} tok/s  p50 "
                        f"{one['p50_latency_s']:.2f}s p99 {one['p99_latency_s']:.2f}s  tau "
                        f"{one['mean_accepted_length'] or 0:.2f}"
                        + (f"  (pass {repeat + 1}/{args.repeats})" if args.repeats > 1 else ""),
                        file=sys.stderr,
                    )
            level_rows = []
            for method in methods:
                runs = passes[method]
                row = summarise(
                    method,
                    concurrency,
                    [r for run in runs for r in run[0]],
                    sum(run[1] for run in runs),
                    max(run[2] for run in runs),
                    runs[0][3],
                    runs[-1][4],
                )
                row["repeats"] = len(runs)
                row["tokens_per_second_passes"] = [sum(r["tokens"] for r in run[0]) / run[1] for run in runs]
                row["passes"] = [run[5] for run in runs]
                row["requests"] = [
                    {"pass": i, **{k: r[k] for k in REQUEST_FIELDS}} for i, run in enumerate(runs) for r in run[0]
                ]
                level_rows.append(row)
            add_intervals(level_rows)  # paired by pass across this level's methods
            results.extend(level_rows)
    finally:
        for server in servers.values():
            server.__exit__()
        if round_log is not None:
            round_log.close()
            print(f"[bench] wrote {args.round_log}", file=sys.stderr)
    results.sort(key=lambda r: (levels.index(r["concurrency"]), methods.index(r["method"])))
    print_table(results)
    payload = {
        "args": asdict(args),
        "code": code_provenance(),
        "num_threads": torch.get_num_threads(),
        "machine": machine_summary(),
        "intervals": interval_settings(),
        "results": results,
    }
    with open(args.json, "w") as f:
        json.dump(payload, f, indent=2)
    print(f"[bench] wrote {args.json}", file=sys.stderr)
    if args.plot:
        plot_throughput(results, args.plot)
        print(f"[bench] wrote {args.plot}", file=sys.stderr)
    return 0
