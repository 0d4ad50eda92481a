"""``adaflash soak-opd``: serving with OPD running, adapter swaps and injected faults, checked request by request.

Requests (mixed domains, ``--concurrency`` at a time) go through the serving scheduler with an
:class:`~.opd.AdaFlashOPD` attached. Faults are injected at fixed points of the run:

- ``kill``: the OPD worker thread dies; the scheduler's health check restarts it;
- ``nan``: the next training step gets a NaN gradient; the trainer rolls back;
- ``corrupt``: a corrupt adapter is published with a bumped ``LATEST``; an external engine
  following the publish folder must skip it and keep its last good adapter;
- ``full``: the trainer pauses while traffic goes on, so the buffer overflows and drops its oldest.

Checked: every request finishes exactly once, greedy outputs equal the target's own (run it in fp32
for exact equality), and resident memory stays flat after warm-up (:func:`memory_check`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import resource
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ..cli_args import drafter_field, dtype_field, target_field

logger = logging.getLogger(__name__)

FAULTS = ("kill", "nan", "corrupt", "full")
MEMORY_EVERY = 10  # requests between two samples of resident memory
MEMORY_WINDOWS = 6  # windows after warm-up whose troughs are compared


@dataclass
class SoakArgs:
    """Options of ``adaflash soak-opd``."""

    target: str = target_field("smollm2-135m")
    drafter: str = drafter_field()
    dtype: str = dtype_field("the target and drafter (fp32: outputs are compared bit for bit)", default="fp32")
    requests: int = field(default=1000, metadata={"help": "Requests in the soak."})
    concurrency: int = field(default=8, metadata={"help": "Requests in flight at once."})
    distinct_prompts: int = field(
        default=48, metadata={"help": "Distinct prompts (mixed domains, train split); requests cycle through them."}
    )
    max_new_tokens: int = field(default=32, metadata={"help": "New tokens per request."})
    faults: str = field(
        default="kill,nan,corrupt,full",
        metadata={"help": "Faults to inject, spread over the run (subset of kill, nan, corrupt, full)."},
    )
    output: str = field(
        default="benchmarks/soak/smollm2-135m.json", metadata={"help": "Report JSON (a .txt summary goes beside it)."}
    )

    def __post_init__(self) -> None:
        for name in ("requests", "concurrency", "distinct_prompts", "max_new_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}.")
        unknown = set(self.fault_list) - set(FAULTS)
        if unknown:
            raise ValueError(f"unknown fault(s) {sorted(unknown)}: choose from {', '.join(FAULTS)}.")

    @property
    def fault_list(self) -> list[str]:
        return [f.strip() for f in self.faults.split(",") if f.strip()]


def rss_mb() -> float:
    """Current resident set size of this process in MiB (Linux /proc; falls back to the peak)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * resource.getpagesize() / 2**20
    except OSError:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def memory_check(samples: list[float], windows: int = MEMORY_WINDOWS) -> dict:
    """Whether resident memory stays flat after warm-up, compared trough to trough.

    ``samples`` are RSS readings in MiB at even request counts; the first quarter is warm-up. Between two
    readings RSS swings by a few hundred MiB as the trainer allocates a batch's activations and frees them, so
    single readings say little; a leak raises the floor. The readings after warm-up are cut into ``windows``
    equal windows, and the growth is the highest window minimum less the first window's. It must stay under
    10 % of that first minimum + 100 MiB.
    """
    after = samples[len(samples) // 4 :]
    if not after:
        raise ValueError("memory_check needs at least one RSS sample.")
    n = min(windows, len(after))
    troughs = [min(after[i * len(after) // n : (i + 1) * len(after) // n]) for i in range(n)]
    growth, allowed = max(troughs) - troughs[0], 0.1 * troughs[0] + 100
    return {
        "windows": n,
        "troughs_mb": [round(t, 1) for t in troughs],
        "growth_mb": round(growth, 1),
        "allowed_mb": round(allowed, 1),
        "flat": growth < allowed,
    }


def soak(
    target,
    drafter,
    tokenizer,
    prompts: list[list[int]],
    references: list[list[int]],
    *,
    requests: int,
    concurrency: int,
    max_new_tokens: int,
    faults: list[str],
    opd_config=None,
    publish_dir: str | None = None,
) -> dict:
    """Run the soak on loaded models; ``references[i]`` is the target's own greedy output for ``prompts[i]``."""
    import copy

    import torch

    from ..decoding.engine import generate
    from ..serving.scheduler import RequestParams, Scheduler, SchedulerConfig
    from .adapters import AdapterFollower, AdapterSlot, attach_lora
    from .opd import AdaFlashOPD, OPDConfig

    publish_dir = publish_dir or tempfile.mkdtemp(prefix="adaflash-soak-")
    base = copy.deepcopy(drafter)  # the external engine's drafter, before LoRA is injected into the serving one
    config = opd_config or OPDConfig(
        min_trajectories=4, batch_trajectories=2, steps_per_version=2, duty_cycle=0.5, lr=1e-3, buffer_trajectories=32
    )
    config.publish_dir = publish_dir
    opd = AdaFlashOPD(target, drafter, config, base_drafter_name="soak-drafter")
    scheduler = Scheduler(
        target,
        drafter,
        tokenizer,
        SchedulerConfig(max_batch_size=concurrency, max_queue=4 * concurrency, calibrate=False),
        opd=opd,
    )
    external = attach_lora(base, opd.settings)
    follower = AdapterFollower(publish_dir, AdapterSlot(external))
    fault_at = {f: int(requests * (i + 1) / (len(faults) + 1)) for i, f in enumerate(faults)}
    log: list[dict] = []
    memory: list[dict] = []
    results: dict[int, list] = {}
    mismatches: list[int] = []
    duplicates: list[int] = []

    def external_check(n: int = 3) -> bool:
        """Serve a few requests on the engine that follows the publish folder; all must equal the target's."""
        follower.poll()
        follower.slot.apply_pending()
        ok = True
        for i in range(n):
            ids = torch.tensor([prompts[i]])
            out = generate(target, external, ids, torch.ones_like(ids), max_new_tokens=max_new_tokens, do_sample=False)
            ok &= out.sequences[0, ids.shape[1] :].tolist()[: out.num_new_tokens[0]] == references[i]
        return ok

    def inject(fault: str, done: int) -> None:
        entry = {"fault": fault, "at_request": done, "opd_before": _brief(opd.status())}
        if fault in ("kill", "nan"):
            opd.inject_fault(fault)
        elif fault == "corrupt":
            entry["external_ok_before"] = external_check()
            good = follower.slot.version
            bad = max([good, opd.version, *[int(p.name[1:]) for p in Path(publish_dir).glob("v[0-9]*")]]) + 1
            folder = Path(publish_dir) / f"v{bad:04d}"
            folder.mkdir(parents=True)
            (folder / "adapter_model.safetensors").write_bytes(b"\x00corrupt adapter")
            (Path(publish_dir) / "LATEST").write_text(f"{bad}\n")
            entry["external_ok_after"] = external_check()
            entry["external_version"], entry["external_errors"] = follower.slot.version, list(follower.errors)
            # the trainer keeps publishing meanwhile, so the follower may move past ``good`` to a newer valid version
            skipped = any(error.startswith(f"v{bad}:") for error in follower.errors)
            entry["recovered"] = entry["external_ok_after"] and good <= follower.slot.version != bad and skipped
        elif fault == "full":
            opd.stop()  # the trainer pauses: traffic fills the buffer past its bound
            entry["paused_until"] = min(requests - 1, done + max(2 * config.buffer_trajectories, requests // 10))
        log.append(entry)

    async def client() -> None:
        loop_start = time.perf_counter()
        next_request = 0
        paused_until = None

        async def one(i: int) -> None:
            stream = scheduler.submit(prompts[i % len(prompts)], RequestParams(max_new_tokens=max_new_tokens))
            tokens, reason = await stream.collect()
            if i in results:
                duplicates.append(i)
            results[i] = [tokens, reason]
            if tokens != references[i % len(prompts)]:
                mismatches.append(i)

        pending: set[asyncio.Task] = set()
        while next_request < requests or pending:
            while next_request < requests and len(pending) < concurrency:
                for fault, at in fault_at.items():
                    if next_request == at:
                        inject(fault, next_request)
                        if fault == "full":
                            paused_until = log[-1]["paused_until"]
                if paused_until is not None and next_request >= paused_until:
                    for entry in log:
                        if entry["fault"] == "full":
                            entry["buffer_at_resume"] = opd.buffer.counters()
                    opd.start()
                    paused_until = None
                pending.add(asyncio.create_task(one(next_request)))
                next_request += 1
                if next_request % MEMORY_EVERY == 0:
                    memory.append(
                        {
                            "requests": next_request,
                            "rss_mb": round(rss_mb(), 1),
                            "seconds": round(time.perf_counter() - loop_start, 1),
                            "opd": _brief(opd.status()),
                        }
                    )
                    logger.log(
                        logging.INFO if next_request % (10 * MEMORY_EVERY) == 0 else logging.DEBUG,
                        "soak: %d requests, rss %.0f MiB, adapter v%d",
                        next_request,
                        memory[-1]["rss_mb"],
                        opd.slot.version,
                    )
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                task.result()
        # the worker takes an injected kill or NaN at its next step, which on a loaded machine can come
        # after the last request: give it a bounded while, supervised as the engine does between rounds
        deadline = time.perf_counter() + 60
        while time.perf_counter() < deadline and not _faults_taken(opd.status(), fault_at):
            opd.check_health()
            await asyncio.sleep(0.1)

    scheduler.start()
    start = time.perf_counter()
    try:
        asyncio.run(client())
    finally:
        scheduler.stop()
    seconds = time.perf_counter() - start
    status = opd.status()
    for entry in log:
        if entry["fault"] == "kill":
            entry["recovered"] = status["restarts"] >= 1
        elif entry["fault"] == "nan":
            entry["recovered"] = status["nan_steps"] >= 1
        elif entry["fault"] == "full":
            buffer = entry.get("buffer_at_resume", status["buffer"])
            entry["recovered"] = buffer["dropped"] > 0 and buffer["size"] <= config.buffer_trajectories
    memory_flat = memory_check([m["rss_mb"] for m in memory] or [rss_mb()])
    lost = [i for i in range(requests) if i not in results or results[i][1] not in ("stop", "length")]
    report = {
        "requests": requests,
        "concurrency": concurrency,
        "max_new_tokens": max_new_tokens,
        "seconds": round(seconds, 1),
        "lost": lost,
        "duplicated": duplicates,
        "mismatched": mismatches,
        "faults": log,
        "memory": memory,
        "memory_check": memory_flat,
        "rss_growth_after_warmup_mb": memory_flat["growth_mb"],
        "opd": _brief(status),
        "adapter_swaps": status["swaps"],
        "published_versions": status["published"],
    }
    report["passed"] = (
        not lost and not duplicates and not mismatches and all(e.get("recovered") for e in log) and memory_flat["flat"]
    )
    return report


def _faults_taken(status: dict, faults) -> bool:
    """Whether the worker has met every injected kill (a restart) and NaN (a skipped step)."""
    return ("kill" not in faults or status["restarts"] >= 1) and ("nan" not in faults or status["nan_steps"] >= 1)


def _brief(status: dict) -> dict:
    keep = (
        "state",
        "worker_alive",
        "adapter_version",
        "published_version",
        "steps",
        "nan_steps",
        "restarts",
        "swaps",
        "published",
        "rejected_versions",
        "errors",
        "buffer",
    )
    return {k: status[k] for k in keep}


def run_soak(args: SoakArgs) -> int:
    import torch

    from ..cli_args import encode_prompt
    from ..data import load_prompts
    from ..drafters import load_drafter
    from ..provenance import script_provenance
    from ..targets import load_target

    target, tokenizer = load_target(args.target, dtype=args.dtype)
    drafter = load_drafter(args.drafter, target, target_name=args.target)
    rows = load_prompts("all", split="train", limit_per_domain=max(1, args.distinct_prompts // 6 + 1)).to_list()
    rows = rows[:: max(1, len(rows) // args.distinct_prompts)][: args.distinct_prompts]
    prompts = [encode_prompt(tokenizer, r["prompt"])[0].tolist() for r in rows]
    references = []
    for p in prompts:  # the target's own greedy output, one prompt at a time
        ids = torch.tensor([p])
        out = target.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=args.max_new_tokens,
            do_sample=False,
            pad_token_id=tokenizer.pad_token_id,
        )[0, len(p) :].tolist()
        eos = set(torch.tensor(target.generation_config.eos_token_id).flatten().tolist())
        cut = next((i + 1 for i, t in enumerate(out) if t in eos), len(out))
        references.append(out[:cut])
    output = Path(args.output)
    output.parent.mkdir(parents=True, exist_ok=True)
    report = soak(
        target,
        drafter,
        tokenizer,
        prompts,
        references,
        requests=args.requests,
        concurrency=args.concurrency,
        max_new_tokens=args.max_new_tokens,
        faults=args.fault_list,
        publish_dir=str(output.with_suffix("")) + "_publish",
    )
    command = "adaflash soak-opd " + " ".join(f"--{k.replace('_', '-')} {v}" for k, v in asdict(args).items())
    report = {
        "command": command,
        "domains": sorted({r["domain"] for r in rows}),
        **report,
        "provenance": script_provenance(command),  # committed_in is added with the commit that publishes it
    }
    output.write_text(json.dumps(report, indent=2))
    summary = summarise(report)
    output.with_suffix(".txt").write_text(summary + "\n")
    plot = plot_memory(report, output.with_suffix(".png"))
    print(summary + (f"\nRSS over requests: {plot}" if plot else ""))
    return 0 if report["passed"] else 1


def plot_memory(report: dict, path: Path) -> Path | None:
    """RSS over requests, the window troughs :func:`memory_check` compares, the bound and the faults, as a PNG."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        logger.warning("matplotlib is not installed: no plot (pip install 'adaflash-hf[train]').")
        return None
    memory, check = report["memory"], report["memory_check"]
    requests = [m["requests"] for m in memory]
    fig, ax = plt.subplots(figsize=(8, 4))
    ax.plot(requests, [m["rss_mb"] for m in memory], lw=1, color="tab:blue", label="RSS")
    after = requests[len(requests) // 4 :]
    n = check["windows"]
    for i, trough in enumerate(check["troughs_mb"]):
        window = after[i * len(after) // n : (i + 1) * len(after) // n]
        ax.hlines(trough, window[0], window[-1], color="tab:green", lw=2, label="window troughs" if i == 0 else None)
    first = check["troughs_mb"][0]
    ax.axhline(first + check["allowed_mb"], color="tab:red", ls="--", lw=1, label="first trough + allowed growth")
    for entry in report["faults"]:
        ax.axvline(entry["at_request"], color="grey", ls=":", lw=1)
        ax.annotate(
            entry["fault"],
            (entry["at_request"], 1),
            xycoords=("data", "axes fraction"),
            fontsize=8,
            rotation=90,
            va="top",
            ha="right",
        )
    ax.set_xlabel("requests submitted")
    ax.set_ylabel("resident memory (MiB)")
    verdict = "flat" if check["flat"] else "NOT flat"
    ax.set_title(f"OPD soak: growth {check['growth_mb']:.0f} MiB of {check['allowed_mb']:.0f} allowed ({verdict})")
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def summarise(report: dict) -> str:
    lines = [
        f"OPD soak: {report['requests']} requests, concurrency {report['concurrency']}, {report['seconds']} s: "
        f"{'PASSED' if report['passed'] else 'FAILED'}",
        f"lost {len(report['lost'])}, duplicated {len(report['duplicated'])}, outputs different from the target's "
        f"{len(report['mismatched'])}",
        f"adapter versions published {report['published_versions']}, swaps {report['adapter_swaps']}, "
        f"rss growth after warm-up {report['rss_growth_after_warmup_mb']} MiB (window troughs; allowed "
        f"{report['memory_check']['allowed_mb']} MiB)",
    ]
    for entry in report["faults"]:
        lines.append(
            f"fault {entry['fault']:8s} at request {entry['at_request']:5d}: "
            f"{'recovered' if entry.get('recovered') else 'NOT recovered'}"
        )
    return "\n".join(lines)
