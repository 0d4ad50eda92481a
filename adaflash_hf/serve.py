"""``adaflash serve``: its command-line arguments and the assembly of target, drafter, OPD and server.

This module sits above both :mod:`adaflash_hf.serving` (the scheduler and the HTTP app, which take an
OPD trainer as a plain object) and :mod:`adaflash_hf.online` (the trainer, whose soak drives the
serving scheduler): it is the one place that wires the two together. fastapi, uvicorn and torch are
imported inside functions, so the CLI reads ``ServeArgs`` without the serve extra installed.
"""

import logging
import math
import os
from dataclasses import dataclass, field

from .cli_args import (
    DTYPES,
    check_choice,
    check_port_free,
    drafter_field,
    dtype_field,
    host_field,
    port_field,
    target_field,
)
from .targets import DEFAULT_TARGET

logger = logging.getLogger(__name__)

API_KEY_ENV = "ADAFLASH_API_KEY"


@dataclass
class ServeArgs:
    target: str = target_field(DEFAULT_TARGET)
    drafter: str = drafter_field()
    host: str = host_field("the server (set --api-key then)")
    port: int = port_field(8000)
    api_key: str | None = field(
        default=None,
        metadata={
            "help": "Key that every /v1/* request must send as 'Authorization: Bearer <key>' (default: "
            f"${API_KEY_ENV}, else none). /health and /metrics stay open."
        },
    )
    dtype: str = dtype_field()
    max_batch_size: int = field(default=32, metadata={"help": "Most requests decoding at once."})
    max_queue: int = field(
        default=256,
        metadata={"help": "Most requests waiting; past it, new ones get HTTP 429 with a Retry-After header."},
    )
    request_timeout: float | None = field(
        default=None,
        metadata={
            "help": "Seconds a request may take (queued and running) when it sends no 'timeout', and the most it may "
            "ask for; past it the request ends with HTTP 408 and frees its slot (default: no limit)."
        },
    )
    drain_timeout: float = field(
        default=30.0,
        metadata={
            "help": "On SIGTERM or SIGINT: seconds the requests in flight may take to finish before they are cancelled "
            "(new ones get HTTP 503); a second signal exits at once."
        },
    )
    verify_len: int | None = field(
        default=None,
        metadata={
            "help": "Tokens the target verifies per round (anchor + drafts); default: chosen per round for the most "
            "expected tokens per second at the current load."
        },
    )
    max_row_slowdown: float | None = field(
        default=None,
        metadata={
            "help": "With the adaptive policy: drop drafts until no request at plain pace decodes more than this "
            "many times slower than under plain batched decoding (its tail latency), e.g. 1.05; default: no bound."
        },
    )
    sources: str = field(
        default="drafter,suffix,global,datastore",
        metadata={
            "help": "Draft sources the engine may choose from each round (comma-separated subset of drafter, suffix, "
            "global, datastore)."
        },
    )
    tree_nodes: int | None = field(
        default=None,
        metadata={
            "help": "Most draft tokens a row verifies per round as a draft tree of its candidates; 0 verifies the "
            "single best candidate; default: the library's (DraftingConfig.tree_nodes)."
        },
    )
    length_head: str = field(
        default="auto",
        metadata={
            "help": "Adaptive length head that informs the verify-length policy: 'auto' (the one bundled beside the "
            "drafter, if any), 'none', a folder or a Hub id."
        },
    )
    served_model_name: str | None = field(
        default=None, metadata={"help": "Model id that clients send and /v1/models lists (default: --target)."}
    )
    opd: bool = field(
        default=False,
        metadata={
            "help": "On-policy distillation: train LoRA adapters on the drafter from live traffic (on a CPU between "
            "rounds, under --opd-duty-cycle, and while idle) and swap them in between rounds (status under "
            "/v1/status)."
        },
    )
    opd_publish_dir: str | None = field(
        default=None,
        metadata={
            "help": "With --opd: also write each adapter version to this folder (v000N/ + LATEST) for other engines to "
            "follow."
        },
    )
    opd_duty_cycle: float = field(
        default=0.25,
        metadata={"help": "With --opd: share of wall time the trainer may compute; serving keeps the rest."},
    )

    def __post_init__(self):
        if not 0 < self.port < 65536:
            raise ValueError(f"--port {self.port}: choose a TCP port in 1..65535.")
        if self.api_key is None:
            self.api_key = os.environ.get(API_KEY_ENV) or None
        elif not self.api_key.strip():
            raise ValueError("--api-key is empty: pass a non-empty key, or omit it to serve without one.")
        if self.request_timeout is not None and not (self.request_timeout > 0 and math.isfinite(self.request_timeout)):
            raise ValueError(
                f"--request-timeout {self.request_timeout}: must be a number of seconds > 0 (omit it for no limit)."
            )
        if not (self.drain_timeout >= 0 and math.isfinite(self.drain_timeout)):
            raise ValueError(
                f"--drain-timeout {self.drain_timeout}: must be a number of seconds >= 0 "
                "(0 cancels the requests in flight at once)."
            )
        if self.verify_len is not None and self.verify_len < 1:
            raise ValueError(f"--verify-len {self.verify_len}: must be >= 1 (omit it for the adaptive policy).")
        if self.max_row_slowdown is not None and (self.verify_len is not None or not self.max_row_slowdown >= 1):
            raise ValueError(
                f"--max-row-slowdown {self.max_row_slowdown}: give a factor >= 1 (e.g. 1.05), and no --verify-len: "
                "it bounds the adaptive policy's choice."
            )
        check_choice("--dtype", self.dtype, DTYPES)
        self.drafting()  # validates --sources
        if not 0 < self.opd_duty_cycle <= 1:
            raise ValueError(f"--opd-duty-cycle {self.opd_duty_cycle}: must be in (0, 1].")
        if (self.opd_publish_dir or self.opd_duty_cycle != 0.25) and not self.opd:
            raise ValueError("--opd-publish-dir and --opd-duty-cycle need --opd.")

    def __repr__(self) -> str:  # never print the key
        fields = ", ".join(
            f"{name}={'***' if name == 'api_key' and value else value!r}" for name, value in vars(self).items()
        )
        return f"ServeArgs({fields})"

    def drafting(self):
        from .decoding.config import DraftingConfig

        return DraftingConfig.from_sources(self.sources, self.tree_nodes)


def build_scheduler(args: ServeArgs):
    """Load the target and drafter (and the OPD trainer with ``--opd``) and wrap them in a (not yet
    started) `Scheduler`."""
    from .checks import check_verify_len
    from .decoding.policy import FixedVerifyLength
    from .drafters import load_drafter
    from .policies import adaptive_policy
    from .serving.scheduler import Scheduler, SchedulerConfig
    from .targets import load_target

    config = SchedulerConfig(max_batch_size=args.max_batch_size, max_queue=args.max_queue)  # validates both
    target, tokenizer = load_target(args.target, dtype=args.dtype)
    drafter = load_drafter(args.drafter, target, target_name=args.target)
    drafting = args.drafting()
    if args.verify_len is not None:
        check_verify_len(args.verify_len, drafter, drafting)
    if args.verify_len:
        policy = FixedVerifyLength(args.verify_len)
    else:
        policy = adaptive_policy(drafter, args.length_head, args.target, args.max_row_slowdown)
    opd = None
    if args.opd:
        if drafter is None:
            raise ValueError("--opd trains the drafter, but --drafter is none: pass a drafter (or 'auto').")
        from .online import AdaFlashOPD, OPDConfig

        opd = AdaFlashOPD(
            target,
            drafter,
            OPDConfig(duty_cycle=args.opd_duty_cycle, publish_dir=args.opd_publish_dir),
            base_drafter_name=args.drafter,
        )
    return Scheduler(
        target,
        drafter,
        tokenizer,
        config,
        drafting=drafting,
        verify_policy=policy,
        model_name=args.served_model_name or args.target,
        opd=opd,
    )


def run_serve(args: ServeArgs) -> int:
    """Serve until a signal (Ctrl-C or SIGTERM) drains the server; 0 once it has drained and stopped."""
    try:
        import uvicorn  # noqa: F401
    except ImportError as error:
        raise SystemExit(
            f"error: adaflash serve needs the serve extra: pip install 'adaflash-hf[serve]' ({error})."
        ) from None
    from .serving.app import create_app
    from .serving.auth import warn_if_exposed
    from .serving.server import serve

    check_port_free(args.host, args.port)  # before minutes of loading
    warn_if_exposed(args.host, args.api_key)
    scheduler = build_scheduler(args)
    app = create_app(scheduler, manage_scheduler=False, api_key=args.api_key, request_timeout=args.request_timeout)
    serve(scheduler, app, args.host, args.port, args.drain_timeout)
    return 0
