"""``adaflash demo``: plain decoding and AdaFlash side by side on one prompt, in a Gradio page.

Both sides run on the engine core (:mod:`adaflash_hf.demo_race`: one-row ``SpeculativeBatch`` es) with the
same target, prompt ids and sampling. The plain side verifies one token per round (a plain decode
step); the AdaFlash side drafts (drafter block, suffix match, global index, datastore) and verifies.
They take turns on one machine, and the side that has spent less compute time so far steps next: at
any moment each text shows what its side produced in the same amount of time, so the race on screen
is the measured speed-up, on a 2-core CPU as on a GPU.

Each accepted token is coloured by where it came from: in a round's chunk every token but the last
is a draft the target accepted (from that round's source), the last is the target's own token. The
page also shows tau (tokens per round), tokens per second, the speed-up, the verify length chosen in
every round (by the length head when one is loaded) and, with an on-policy distillation worker
(``opd``), its ``status()``: the adapter version and the tau history.

Address and port: ``--host`` and ``--port`` when given, else Gradio's own ``GRADIO_SERVER_NAME`` and
``GRADIO_SERVER_PORT`` (as hosting platforms set them), else 127.0.0.1:7860 (this machine only).

gradio and torch are imported inside functions, so the CLI reads ``DemoArgs`` without the demo extra.
"""

from __future__ import annotations

import html
import logging
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .cli_args import DTYPES, check_choice, check_port_free, drafter_field, dtype_field, target_field
from .demo_race import TARGET, Race, Side, race, token_spans
from .targets import DEFAULT_TARGET

if TYPE_CHECKING:
    import gradio
    from transformers import PreTrainedModel

    from .decoding.sampling import SamplingParams

logger = logging.getLogger(__name__)

GRADIO_RANGE = ">=5.0,<7"  # the demo extra's pin (pyproject.toml)
SOURCE_STYLES = {  # label -> (legend text, background colour)
    "drafter": ("drafter", "#a5b4fc"),
    "suffix": ("suffix match", "#86efac"),
    "global": ("global index", "#fcd34d"),
    "datastore": ("datastore", "#f9a8d4"),
    TARGET: ("target's own token", "#d1d5db"),
}
REFRESH_S = 0.1  # the page is redrawn at most this often while decoding (and once at the end)
EXAMPLES = [
    "Write a Python function that checks whether a number is prime.",
    "List the planets of the solar system, one per line, each with its number of moons.",
    "Explain in three sentences why the sky is blue.",
]


@dataclass
class DemoArgs:
    target: str = target_field(DEFAULT_TARGET)
    drafter: str = drafter_field()
    length_head: str = field(
        default="auto",
        metadata={
            "help": "Adaptive length head that chooses the verify lengths: 'auto' (the one bundled beside the "
            "drafter, if any), 'none', a folder or a Hub id."
        },
    )
    dtype: str = dtype_field()
    host: str | None = field(
        default=None,
        metadata={
            "help": "Address to bind: 127.0.0.1 serves this machine only; "
            "0.0.0.0 exposes the demo to the network (default: "
            "$GRADIO_SERVER_NAME, else 127.0.0.1)."
        },
    )
    port: int | None = field(default=None, metadata={"help": "TCP port (default: $GRADIO_SERVER_PORT, else 7860)."})
    max_new_tokens: int = field(default=200, metadata={"help": "Default of the page's token budget slider."})
    share: bool = field(
        default=False,
        metadata={"help": "Also open a temporary public gradio.live link: anyone with the link can use the demo."},
    )

    def __post_init__(self):
        if self.host is None:
            self.host = os.environ.get("GRADIO_SERVER_NAME") or "127.0.0.1"
        if self.port is None:
            port = os.environ.get("GRADIO_SERVER_PORT") or "7860"
            try:
                self.port = int(port)
            except ValueError:
                raise ValueError(
                    f"GRADIO_SERVER_PORT={port!r} is not a port number: set it to one in 1..65535, or pass --port."
                ) from None
        if not 0 < self.port < 65536:
            raise ValueError(f"--port {self.port}: choose a TCP port in 1..65535.")
        if self.max_new_tokens < 1:
            raise ValueError(f"--max-new-tokens {self.max_new_tokens}: ask for at least 1 new token.")
        check_choice("--dtype", self.dtype, DTYPES)


# --------------------------------------------------------------------------------------------------
# Rendering: HTML strings and plot tables from a Race (no gradio either)


def text_html(side: Side, tokenizer) -> str:
    """The side's text, each span on its source's colour; ``data-finish`` is set once the side is done."""
    parts = []
    for span in token_spans(tokenizer, side.tokens, side.sources):
        legend, colour = SOURCE_STYLES.get(span.source, SOURCE_STYLES[TARGET])
        parts.append(
            f'<span data-source="{span.source}" data-tokens="{span.num_tokens}" title="{legend}" '
            f'style="background:{colour};color:#111;border-radius:3px">{html.escape(span.text)}</span>'
        )
    return (
        f'<div class="adaflash-text" data-side="{side.name}" data-finish="{side.finish_reason or ""}" '
        f'data-tokens="{len(side.tokens)}" style="white-space:pre-wrap;font-family:monospace;line-height:1.6;'
        f'min-height:12em">{"".join(parts)}</div>'
    )


def legend_html() -> str:
    items = "".join(
        f'<span style="background:{colour};color:#111;border-radius:3px;padding:0 6px;margin-right:8px">'
        f"{html.escape(legend)}</span>"
        for legend, colour in SOURCE_STYLES.values()
    )
    return f'<div style="margin:4px 0">Accepted tokens by origin: {items}</div>'


def stats_html(progress: Race) -> str:
    """tau, tokens per second and rounds of each side, the speed-up, and AdaFlash's rounds by source."""
    plain, ada = progress.plain, progress.adaflash
    rows = [
        ("tokens", len(plain.tokens), len(ada.tokens)),
        ("rounds", plain.stats.num_rounds, ada.stats.num_rounds),
        ("τ (tokens per round)", f"{plain.tau:.2f}", f"{ada.tau:.2f}"),
        ("tok/s", f"{plain.tokens_per_second:.1f}", f"{ada.tokens_per_second:.1f}"),
        ("seconds", f"{plain.seconds:.2f}", f"{ada.seconds:.2f}"),
    ]
    body = "".join(f"<tr><td>{name}</td><td>{a}</td><td>{b}</td></tr>" for name, a, b in rows)
    speedup = "–" if progress.speedup is None else f"{progress.speedup:.2f}×"
    if progress.spec.params.do_sample:
        agreement = "Sampled: the texts differ, their distribution does not."
    elif progress.first_difference is None:
        agreement = f"Identical output{'' if progress.done else ' so far'}: ✓"
    else:
        dtype = str(ada.batch.target.dtype).removeprefix("torch.")
        agreement = (
            f"The texts part at token {progress.first_difference}: a near-tie of the target's two best logits "
            f"that {dtype} rounds differently in a multi-token verification than in one-token decoding. "
            "Start the demo with --dtype fp32 for token-for-token equality."
        )
    counts = ada.stats.source_counts()
    by_source = ", ".join(f"{source} {n} (+{accepted} drafts)" for source, (n, accepted) in sorted(counts.items()))
    return (
        f'<div id="adaflash-stats"><table><tr><th></th><th>plain</th><th>AdaFlash</th></tr>{body}</table>'
        f"<p><b>speed-up: <span data-speedup>{speedup}</span></b>"
        f"{' · AdaFlash rounds by source: ' + html.escape(by_source) if by_source else ''}</p>"
        f"<p data-agreement>{html.escape(agreement)}</p></div>"
    )


def verify_lens_html(side: Side, chooser: str) -> str:
    """A bar per round: its verify length (anchor + drafts), coloured by the source of its drafts."""
    lens, sources = side.verify_lens, side.round_sources
    top = max(lens, default=1)
    bars = "".join(
        f'<div title="round {i}: {n} verified ({source})" style="flex:1;max-width:10px;height:{100 * n / top:.0f}%;'
        f'background:{SOURCE_STYLES.get(source, SOURCE_STYLES[TARGET])[1]}"></div>'
        for i, (n, source) in enumerate(zip(lens, sources), start=1)
    )
    counts = ", ".join(f"{n} × {lens.count(n)}" for n in sorted(set(lens)))
    return (
        f'<div id="adaflash-verify-lens" data-rounds="{len(lens)}"><b>AdaFlash verify length per round</b> '
        f"(tokens verified: anchor + drafts, chosen by {chooser}; grey: a plain step)"
        f'<div style="display:flex;align-items:flex-end;gap:1px;height:110px;border-bottom:1px solid #888;'
        f'margin:6px 0">{bars}</div>{f"verify lengths (length × rounds): {counts}" if counts else ""}</div>'
    )


def opd_markdown(status: dict[str, Any]) -> str:
    """The OPD worker's adapter version, then its other scalar counters."""
    extra = [
        f"{key.replace('_', ' ')}: {value}"
        for key, value in status.items()
        if key not in ("adapter_version", "tau_history") and isinstance(value, int | float | str | bool)
    ]
    line = f"**On-policy distillation** · adapter version **{status.get('adapter_version', '–')}**"
    return line + (" · " + " · ".join(extra) if extra else "")


def tau_history_table(status: dict[str, Any]):
    """``status["tau_history"]`` (``[{"requests", "tau"}, ...]``) as a plot table; None while it is empty."""
    import pandas as pd

    history = status.get("tau_history")
    if not history:
        return None
    return pd.DataFrame({"requests": [h["requests"] for h in history], "tau": [h["tau"] for h in history]})


# --------------------------------------------------------------------------------------------------
# The page


def import_gradio():
    """gradio, or an ImportError that says how to install the demo extra."""
    try:
        import gradio
    except ImportError as error:
        raise ImportError(f"adaflash demo needs gradio: pip install 'adaflash-hf[demo]' ({error}).") from error
    from packaging.version import Version

    if not Version("5.0") <= Version(gradio.__version__) < Version("7"):
        raise ImportError(
            f"adaflash demo needs gradio{GRADIO_RANGE}, found {gradio.__version__}: pip install 'gradio{GRADIO_RANGE}'."
        )
    return gradio


def sampling_params(temperature: float) -> SamplingParams:
    from .decoding.sampling import SamplingParams

    return SamplingParams() if temperature == 0 else SamplingParams(do_sample=True, temperature=temperature)


def build_demo(
    target: PreTrainedModel,
    drafter,
    tokenizer,
    *,
    opd=None,
    length_head_policy=None,
    max_new_tokens: int = 200,
    title: str = "AdaFlash: plain decoding vs lossless speculative decoding",
) -> gradio.Blocks:
    """The Gradio page over a loaded target, drafter and tokenizer (not launched).

    opd: an on-policy distillation worker whose ``status()`` dict has ``adapter_version`` and, when
    available, ``tau_history`` (``[{"requests": int, "tau": float}, ...]``); shown under the texts.
    length_head_policy: the AdaFlash side's verify-length policy (default: the engine's goodput policy).
    The verify cost is profiled and both paths are warmed up here, so the first request runs as later ones.
    All torch work (this profile, the warm-up, every race) runs in one thread, :func:`torch_thread`, not in
    Gradio's handler threads: on a CPU each OS thread running torch would own an OpenMP team, and libgomp
    slows every team once there are two (``adaflash_hf/serving/torch_thread.py``).
    """
    gr = import_gradio()
    import torch

    from .decoding.drafting_state import DraftingState
    from .decoding.policy import FixedVerifyLength
    from .decoding.state import RowSpec
    from .prompting import chat_prompt_ids
    from .serving.torch_thread import torch_thread

    compute = torch_thread()
    drafting_state = DraftingState()  # acceptance rates and the global index learn across the page's requests
    compute.call(drafting_state.cost_model.calibrate, target, (1, 2, 4, 8, 16, 32))  # this machine's verify costs
    eos = target.generation_config.eos_token_id
    stop_ids = frozenset() if eos is None else frozenset(torch.tensor(eos).flatten().tolist())
    chooser = "the length head" if length_head_policy is not None else "the goodput policy"

    def run(prompt: str, budget: int, temperature: float) -> Iterator[Race]:
        spec = RowSpec(0, chat_prompt_ids(tokenizer, prompt), int(budget), sampling_params(temperature), stop_ids)
        yield from compute.iterate(
            race(target, drafter, spec, drafting_state=drafting_state, verify_policy=length_head_policy)
        )

    # First passes pay one-off costs; a throwaway state and policy keep them out of what the page's policy learns.
    warm_up = RowSpec(0, chat_prompt_ids(tokenizer, "Hi!"), 8, stop_ids=stop_ids)
    for _ in compute.iterate(
        race(target, drafter, warm_up, drafting_state=DraftingState(), verify_policy=FixedVerifyLength())
    ):
        pass

    def opd_outputs() -> list:
        status = opd.status()
        return [opd_markdown(status), tau_history_table(status)]

    def frame(progress: Race) -> list:
        return [
            text_html(progress.plain, tokenizer),
            text_html(progress.adaflash, tokenizer),
            stats_html(progress),
            verify_lens_html(progress.adaflash, chooser),
        ] + (opd_outputs() if opd is not None else [])

    def compare(prompt: str, budget: int, temperature: float):
        if not prompt.strip():
            raise gr.Error("Type a prompt first.")
        shown = 0.0
        for progress in run(prompt, budget, temperature):
            if progress.done or time.perf_counter() - shown > REFRESH_S:
                shown = time.perf_counter()
                yield frame(progress)

    with gr.Blocks(title=title, analytics_enabled=False) as demo:
        gr.Markdown(
            f"## {title}\nThe same target model answers twice: alone (one token per forward pass) and with "
            "AdaFlash (drafts verified in one pass; the output is the target's own, token for token when "
            "greedy). The side that has used less compute time steps next, so the texts race at their real speeds."
        )
        with gr.Row():
            prompt = gr.Textbox(label="Prompt", value=EXAMPLES[0], lines=2, scale=4, elem_id="prompt")
            with gr.Column(scale=1):
                budget = gr.Slider(1, max(512, max_new_tokens), value=max_new_tokens, step=1, label="Max new tokens")
                temperature = gr.Slider(
                    0.0,
                    1.5,
                    value=0.0,
                    step=0.05,
                    label="Temperature (0 = greedy; sampled texts differ, their distribution does not)",
                )
        button = gr.Button("Generate", variant="primary", elem_id="generate")
        gr.Examples(EXAMPLES, inputs=prompt)
        gr.HTML(legend_html())
        with gr.Row():
            with gr.Column():
                gr.Markdown("### Plain decoding")
                plain_text = gr.HTML(elem_id="plain-text")
            with gr.Column():
                gr.Markdown("### AdaFlash")
                adaflash_text = gr.HTML(elem_id="adaflash-text")
        with gr.Row():
            stats = gr.HTML(elem_id="stats")
            verify_lens = gr.HTML(elem_id="verify-lens")
        outputs = [plain_text, adaflash_text, stats, verify_lens]
        if opd is not None:
            with gr.Row():
                opd_status = gr.Markdown(elem_id="opd-status")
                tau_plot = gr.LinePlot(
                    x="requests", y="tau", title="τ over requests served (OPD)", height=260, elem_id="opd-tau"
                )
            outputs += [opd_status, tau_plot]
            demo.load(opd_outputs, outputs=[opd_status, tau_plot])
        # one comparison at a time: both sides share the model, and their timings need the machine to themselves
        button.click(compare, inputs=[prompt, budget, temperature], outputs=outputs, concurrency_limit=1)
    return demo


def load_demo(args: DemoArgs) -> gradio.Blocks:
    """Load the target, drafter and length head that ``args`` name, and build the page on them."""
    import_gradio()
    from .drafters import load_drafter
    from .policies import adaptive_policy
    from .serving.torch_thread import torch_thread
    from .targets import load_target

    def load():  # in the thread that will run every race (build_demo)
        target, tokenizer = load_target(args.target, dtype=args.dtype)
        drafter = load_drafter(args.drafter, target, target_name=args.target)
        return target, tokenizer, drafter, adaptive_policy(drafter, args.length_head, args.target)

    target, tokenizer, drafter, policy = torch_thread().call(load)
    return build_demo(target, drafter, tokenizer, length_head_policy=policy, max_new_tokens=args.max_new_tokens)


def run_demo(args: DemoArgs) -> int:
    """Serve the page on ``args.host:args.port`` until interrupted (Ctrl-C)."""
    import_gradio()
    check_port_free(args.host, args.port)  # before minutes of loading
    demo = load_demo(args)
    logger.info("demo of %s on http://%s:%d", args.target, args.host, args.port)
    demo.launch(server_name=args.host, server_port=args.port, share=args.share)
    return 0
