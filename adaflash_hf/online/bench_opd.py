"""``adaflash bench-opd``: does on-line distillation adapt the drafter to a domain it never saw?

1. Load the target and the shipped drafter (trained without ``--shift-domain``).
2. Measure τ on the eval prompts (``--eval-prompts`` file, or the project's eval split): the shift
   domain and the trained domains, greedy, drafter block only at full verify length, so τ measures
   the drafter alone.
3. OPD on: serve the live stream (the project's *train* prompts of the shift domain, never the
   eval prompts) one request at a time, with trajectory recording, training (inline between rounds
   on a CPU) and adapter swaps; every ``--eval-every`` requests measure τ again (eval requests are
   not recorded).
4. OPD off: right after each block of the stream, serve the same requests again with no recording
   and no training (the current adapter serves), so the tokens per second of both are measured
   side by side and drift of the machine over the run hits both alike.
5. Write a table, JSON (``shift_domain``, ``requests``, τ before/after on both sets, tokens per
   second with OPD on and off, ``curve``) and a plot of τ over requests.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from ..cli_args import DRAFTER_HELP, drafter_field, dtype_field, num_threads_field, seed_field, target_field
from .configs import OPDConfig

logger = logging.getLogger(__name__)


@dataclass
class BenchOPDArgs:
    """Options of ``adaflash bench-opd``."""

    target: str = target_field("smollm2-135m")
    drafter: str = drafter_field(help_text=f"Drafter to adapt: {DRAFTER_HELP}")
    dtype: str = dtype_field()
    shift_domain: str = field(
        default="fiction",
        metadata={"help": "Domain the drafter never trained on; the live stream comes from its train split."},
    )
    trained_domains: str = field(
        default="code,math,chat", metadata={"help": "Domains the drafter was trained on (τ must not drop there)."}
    )
    requests: int = field(default=200, metadata={"help": "Live requests streamed with OPD on."})
    off_requests: int | None = field(
        default=None,
        metadata={
            "help": (
                "Requests served again with OPD off, block by block after the OPD-on ones, for the throughput "
                "baseline (default: --requests)."
            )
        },
    )
    eval_prompts: str | None = field(
        default=None,
        metadata={"help": "JSONL of {prompt, domain} for τ (default: the eval split, --eval-per-domain per domain)."},
    )
    eval_per_domain: int = field(
        default=8, metadata={"help": "Eval prompts per domain when --eval-prompts is not given."}
    )
    eval_every: int = field(default=50, metadata={"help": "Measure τ every this many live requests."})
    max_new_tokens: int = field(default=64, metadata={"help": "New tokens per live and eval request."})
    duty_cycle: float = field(
        default=OPDConfig.duty_cycle, metadata={"help": "Share of wall time the OPD trainer may compute."}
    )
    lr: float = field(default=OPDConfig.lr, metadata={"help": "OPD learning rate."})
    lora_rank: int = field(default=OPDConfig.lora_rank, metadata={"help": "LoRA rank."})
    worker: str = field(
        default=OPDConfig.worker,
        metadata={"help": "Where OPD trains: auto, inline (the engine's thread, between rounds) or thread."},
    )
    replay: int = field(
        default=OPDConfig.replay_trajectories,
        metadata={"help": "Trained trajectories the idle trainer revisits (0: each is trained on once)."},
    )
    rehearsal: int = field(
        default=OPDConfig.rehearsal_trajectories,
        metadata={
            "help": (
                "Trajectories of the drafter's training domains (its datastore) mixed into every OPD batch, "
                "against forgetting them."
            )
        },
    )
    num_threads: int | None = num_threads_field(" for serving")
    output: str = field(
        default="benchmarks/opd/smollm2-135m.json",
        metadata={"help": "JSON output (a .png plot and .txt table go beside it)."},
    )
    seed: int = seed_field("the live stream order and of OPD")

    def __post_init__(self) -> None:
        from ..data.prompts import DOMAINS

        if self.rehearsal < 0:
            raise ValueError(f"--rehearsal must be >= 0, got {self.rehearsal}.")
        for name in ("requests", "eval_per_domain", "eval_every", "max_new_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}.")
        if self.replay < 0:
            raise ValueError(f"--replay must be >= 0, got {self.replay}.")
        if self.off_requests is not None and self.off_requests < 0:
            raise ValueError(f"--off-requests must be >= 0, got {self.off_requests}.")
        domains = [self.shift_domain, *self.trained]
        unknown = [d for d in domains if d not in DOMAINS]
        if unknown:
            raise ValueError(f"unknown domain(s) {unknown}: choose from {', '.join(DOMAINS)}.")
        if self.shift_domain in self.trained:
            raise ValueError(
                f"--shift-domain {self.shift_domain} is also in --trained-domains; it must be a domain the drafter "
                f"never saw."
            )

    @property
    def trained(self) -> list[str]:
        return [d.strip() for d in self.trained_domains.split(",") if d.strip()]


def _eval_prompts(args: BenchOPDArgs) -> list[dict]:
    from ..data import load_prompts, load_prompts_jsonl

    if args.eval_prompts:
        rows = load_prompts_jsonl(args.eval_prompts).to_list()
        if not any(r["domain"] == args.shift_domain for r in rows):
            raise ValueError(
                f"{args.eval_prompts} has no prompt of domain {args.shift_domain!r}: τ on the shift domain needs some."
            )
    else:
        rows = []
        for domain in [args.shift_domain, *args.trained]:
            rows += load_prompts(domain, split="eval", limit_per_domain=args.eval_per_domain).to_list()
    return [{"prompt": r["prompt"], "domain": r["domain"]} for r in rows]


def _live_prompts(args: BenchOPDArgs, exclude: set[str]) -> list[str]:
    import random

    from ..data import load_prompts

    prompts = [
        r["prompt"] for r in load_prompts(args.shift_domain, split="train").to_list() if r["prompt"] not in exclude
    ]
    if not prompts:
        raise ValueError(f"no train prompts of domain {args.shift_domain!r} to stream.")
    random.Random(args.seed).shuffle(prompts)
    return [prompts[i % len(prompts)] for i in range(args.requests)]


def run_bench_opd(args: BenchOPDArgs) -> int:
    import torch

    from ..cli_args import encode_prompt
    from ..decoding.config import DraftingConfig
    from ..decoding.drafting_state import DraftingState
    from ..decoding.engine import generate
    from ..decoding.policy import FixedVerifyLength
    from ..drafters import load_drafter
    from ..provenance import code_provenance
    from ..targets import load_target
    from .opd import AdaFlashOPD

    if args.num_threads is not None:
        torch.set_num_threads(args.num_threads)
    target, tokenizer = load_target(args.target, dtype=args.dtype)
    drafter = load_drafter(args.drafter, target, target_name=args.target)
    eval_rows = _eval_prompts(args)
    eval_ids = [(r["domain"], encode_prompt(tokenizer, r["prompt"])) for r in eval_rows]
    live_ids = [encode_prompt(tokenizer, p) for p in _live_prompts(args, {r["prompt"] for r in eval_rows})]
    pad = tokenizer.pad_token_id

    def measure_tau() -> dict[str, float]:
        """τ of the drafter alone per domain, pooled over its prompts: it drafts a full block every round (no
        suffix sources, never skipped for not paying, which would count plain steps as τ 1)."""
        state = DraftingState(replace(DraftingConfig.only("drafter"), drafter_every_round=True))
        lengths: dict[str, list[int]] = {}
        for domain, ids in eval_ids:
            out = generate(
                target,
                drafter,
                ids,
                torch.ones_like(ids),
                max_new_tokens=args.max_new_tokens,
                do_sample=False,
                pad_token_id=pad,
                verify_policy=FixedVerifyLength(drafter.config.block_size),
                drafting=state.config,
                drafting_state=state,
                observer=_NO_OBSERVER,
            )
            lengths.setdefault(domain, []).extend(a + 1 for r in out.stats.rounds for a in r.accept_lengths)
        shift = lengths.pop(args.shift_domain)
        trained = [x for d in args.trained for x in lengths.get(d, [])]
        return {"shift": sum(shift) / len(shift), "trained": sum(trained) / len(trained) if trained else float("nan")}

    def serve(prompts, observer) -> tuple[int, float]:
        state = DraftingState()
        tokens, seconds = 0, 0.0
        for ids in prompts:
            start = time.perf_counter()
            out = generate(
                target,
                drafter,
                ids,
                torch.ones_like(ids),
                max_new_tokens=args.max_new_tokens,
                do_sample=False,
                pad_token_id=pad,
                drafting_state=state,
                observer=observer,
            )
            seconds += time.perf_counter() - start
            tokens += out.num_new_tokens[0]
        return tokens, seconds

    serve(live_ids[:2], None)  # warm up both paths before timing anything
    before = measure_tau()
    print(f"τ before: {args.shift_domain} {before['shift']:.3f}, trained {before['trained']:.3f}", flush=True)
    off_n = args.requests if args.off_requests is None else args.off_requests
    off_tokens, off_seconds = 0, 0.0

    opd = AdaFlashOPD(
        target,
        drafter,
        OPDConfig(
            duty_cycle=args.duty_cycle,
            lr=args.lr,
            lora_rank=args.lora_rank,
            seed=args.seed,
            replay_trajectories=args.replay,
            rehearsal_trajectories=args.rehearsal,
            worker=args.worker,
        ),
        base_drafter_name=args.drafter,
    )
    opd.start()
    curve = [{"requests": 0, "tau_shift": before["shift"], "tau_trained": before["trained"], "adapter_version": 0}]
    on_tokens, on_seconds = 0, 0.0
    for start in range(0, args.requests, args.eval_every):
        tokens, seconds = serve(live_ids[start : start + args.eval_every], opd.observer)
        on_tokens, on_seconds = on_tokens + tokens, on_seconds + seconds
        # OPD off: the same requests again, no recording and no training (the current adapter serves), right
        # after the OPD-on block, so drift of the machine over the run hits both alike
        off_block = live_ids[start : start + args.eval_every][: max(0, off_n - start)]
        if off_block:
            tokens, seconds = serve(off_block, None)
            off_tokens, off_seconds = off_tokens + tokens, off_seconds + seconds
        opd.observer.before_round()  # take the newest version before measuring
        tau = measure_tau()
        done = min(start + args.eval_every, args.requests)
        curve.append(
            {
                "requests": done,
                "tau_shift": tau["shift"],
                "tau_trained": tau["trained"],
                "adapter_version": opd.slot.version,
            }
        )
        print(
            f"{done:4d} requests  τ {args.shift_domain} {tau['shift']:.3f}  trained {tau['trained']:.3f}  "
            f"adapter v{opd.slot.version}  {on_tokens / on_seconds:.1f} tok/s  opd {opd.status()['state']}",
            flush=True,
        )
    opd.stop()
    status = opd.status()
    after = curve[-1]
    result = {
        "command": "adaflash bench-opd "
        + " ".join(f"--{k.replace('_', '-')} {v}" for k, v in asdict(args).items() if v is not None),
        "args": asdict(args),
        "code": code_provenance(),
        "shift_domain": args.shift_domain,
        "trained_domains": args.trained,
        "requests": args.requests,
        "tau_shift_before": before["shift"],
        "tau_shift_after": after["tau_shift"],
        "tau_trained_before": before["trained"],
        "tau_trained_after": after["tau_trained"],
        "tau_shift_gain": after["tau_shift"] / before["shift"] - 1,
        "tau_trained_change": after["tau_trained"] / before["trained"] - 1,
        "tokens_per_second_opd_on": on_tokens / on_seconds,
        "tokens_per_second_opd_off": off_tokens / off_seconds if off_seconds else None,
        "curve": curve,
        "opd_status": {k: v for k, v in status.items() if k != "tau_history"},
        "eval_prompts": len(eval_ids),
    }
    path = Path(args.output)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2))
    table = _table(result)
    path.with_suffix(".txt").write_text(table + "\n")
    print(table)
    _plot(result, path.with_suffix(".png"))
    return 0


class _NoObserver:
    """Eval requests are neither recorded nor the place where adapters change."""

    def before_round(self):
        pass

    def on_prefill(self, *args):
        pass

    def on_round(self, *args):
        pass

    def on_finish(self, row_id):
        pass


_NO_OBSERVER = _NoObserver()


def _table(result: dict) -> str:
    on, off = result["tokens_per_second_opd_on"], result["tokens_per_second_opd_off"]
    lines = [
        f"bench-opd: shift domain {result['shift_domain']}, {result['requests']} live requests",
        f"{'':24s}{'before':>10s}{'after':>10s}{'change':>10s}",
        f"{'τ ' + result['shift_domain']:24s}{result['tau_shift_before']:10.3f}"
        f"{result['tau_shift_after']:10.3f}{result['tau_shift_gain']:+10.1%}",
        f"{'τ trained domains':24s}{result['tau_trained_before']:10.3f}"
        f"{result['tau_trained_after']:10.3f}{result['tau_trained_change']:+10.1%}",
        f"tokens/s OPD on {on:.1f}" + (f", OPD off {off:.1f} (on/off {on / off:.2f})" if off else ""),
    ]
    status = result.get("opd_status") or {}
    if status:
        lines.append(
            f"training: {status.get('steps', 0)} steps in {status.get('train_seconds', 0.0):.1f} s, "
            f"{status.get('published', 0)} version(s) published, {status.get('rejected_versions', 0)} rejected "
            f"({status.get('retention_rejections', 0)} of them by the retention check)"
        )
    return "\n".join(lines)


def _plot(result: dict, path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        logger.warning("matplotlib is not installed: no plot (pip install 'adaflash-hf[train]').")
        return
    curve = result["curve"]
    x = [c["requests"] for c in curve]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(x, [c["tau_shift"] for c in curve], marker="o", label=f"{result['shift_domain']} (shifted, eval prompts)")
    ax.plot(x, [c["tau_trained"] for c in curve], marker="s", label="trained domains (eval prompts)")
    ax.set_xlabel("live requests with OPD on")
    ax.set_ylabel("τ (drafter block, full verify)")
    ax.set_title("On-line distillation under domain shift")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
