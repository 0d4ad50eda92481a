"""The demo's race (plain vs AdaFlash on the engine core), its colouring and statistics, on tiny fp32 models.

Both sides must reproduce the target's own greedy output; every generated token is coloured exactly
once, drafts by their source and one token per round as the target's own; the page's handler shows
the statistics and a fake OPD worker's status. The browser test (test_demo_browser.py) drives the page.
"""

from __future__ import annotations

import socket
import sys
from types import SimpleNamespace

import pytest
import torch
from fake_scheduler import REPLY, tiny_chat_models, tiny_chat_tokenizer

from adaflash_hf import DraftingState, FixedVerifyLength
from adaflash_hf.cli import main
from adaflash_hf.decoding.state import RowSpec
from adaflash_hf.demo import (
    DemoArgs,
    check_port_free,
    opd_markdown,
    stats_html,
    tau_history_table,
    text_html,
    verify_lens_html,
)
from adaflash_hf.demo_race import TARGET, race, token_spans
from adaflash_hf.prompting import chat_prompt_ids

PROMPTS = ["Hello world, hello there.", "wörld Ça café naïve 🙂 你好 世界 🚀🚀"]


def tiny_stack():
    """A tiny random fp32 llama over a byte-level chat tokenizer, and a fresh drafter for it."""
    return tiny_chat_models()


class FakeOPD:
    """The on-policy distillation worker's ``status()`` contract, with fixed values."""

    def status(self) -> dict:
        return {
            "adapter_version": 7,
            "requests": 40,
            "running": True,
            "tau_history": [{"requests": 20, "tau": 1.75}, {"requests": 40, "tau": 2.25}],
        }


@pytest.fixture(scope="module")
def stack():
    return tiny_stack()


def greedy_reference(target, prompt_ids: list[int], max_new_tokens: int) -> list[int]:
    out = target.generate(torch.tensor([prompt_ids]), max_new_tokens=max_new_tokens, do_sample=False)
    return out[0, len(prompt_ids) :].tolist()


def run_race(stack, prompt: str, max_new_tokens: int, verify_policy=None):
    """The race on a fresh drafting state; verify_policy None is the engine's adaptive (goodput) policy."""
    target, drafter, tokenizer = stack
    prompt_ids = chat_prompt_ids(tokenizer, prompt)
    spec = RowSpec(0, prompt_ids, max_new_tokens, stop_ids=frozenset([tokenizer.eos_token_id]))
    frames = []  # (plain tokens, AdaFlash tokens, done) after every step
    for progress in race(target, drafter, spec, drafting_state=DraftingState(), verify_policy=verify_policy):
        frames.append((len(progress.plain.tokens), len(progress.adaflash.tokens), progress.done))
    return prompt_ids, progress, frames


@pytest.mark.parametrize("policy", ["adaptive", "whole-proposal"])
@pytest.mark.parametrize("prompt", PROMPTS)
def test_both_sides_reproduce_the_targets_greedy_output(stack, prompt, policy):
    target, _, tokenizer = stack
    prompt_ids, progress, frames = run_race(
        stack, prompt, 40, FixedVerifyLength() if policy == "whole-proposal" else None
    )
    reference = greedy_reference(target, prompt_ids, 40)
    assert progress.plain.tokens == reference
    assert progress.adaflash.tokens == reference
    assert (
        progress.plain.finish_reason == progress.adaflash.finish_reason == ("stop" if len(reference) < 40 else "length")
    )
    # the sides take turns: both grow while neither is finished, and frames never lose tokens
    assert any(0 < plain < len(reference) and 0 < ada < len(reference) for plain, ada, _ in frames)
    assert all(a <= b for (a, _, _), (b, _, _) in zip(frames, frames[1:]))
    assert frames[-1][2] and not any(done for *_, done in frames[:-1])


def test_sources_label_every_token_and_one_target_token_per_round(stack):
    _, progress, _ = run_race(stack, "Hello world, hello there. Hello world, hello there.", 60, FixedVerifyLength())
    plain, ada = progress.plain, progress.adaflash
    assert len(plain.sources) == len(plain.tokens) and set(plain.sources) == {TARGET}
    assert plain.stats.num_rounds == len(plain.tokens) - 1 and plain.tau == 1.0  # one token per plain step
    assert len(ada.sources) == len(ada.tokens)
    drafted = [s for s in ada.sources if s != TARGET]
    assert drafted, "no accepted draft in 60 tokens of a repetitive prompt: the test would not check the colouring"
    assert set(drafted) <= {"drafter", "suffix", "global", "datastore"}
    # the prefill token, then per round: its accepted drafts, then the target's own token
    rounds = ada.stats.rounds
    expected = [TARGET] + [label for r in rounds for label in [r.sources[0]] * r.accept_lengths[0] + [TARGET]]
    assert ada.sources == expected[: len(ada.tokens)]  # the last chunk may be cut at a stop id or the budget
    assert ada.tau > 1.0
    assert ada.verify_lens == [r.verify_lens[0] for r in rounds] and min(ada.verify_lens) >= 1


def spans_cover(spans, tokens, sources, tokenizer):
    assert sum(s.num_tokens for s in spans) == len(tokens)
    assert "".join(s.text for s in spans) == tokenizer.decode(tokens, skip_special_tokens=True)
    assert all(a.source != b.source for a, b in zip(spans, spans[1:]))
    start = 0
    for span in spans:  # a span's last token decides its colour (a character split across tokens goes there)
        assert span.num_tokens >= 1 and sources[start + span.num_tokens - 1] == span.source
        start += span.num_tokens


def test_spans_cover_every_token_once_also_across_split_characters():
    tokenizer = tiny_chat_tokenizer()
    tokens = tokenizer.encode(REPLY, add_special_tokens=False) + [tokenizer.eos_token_id]
    assert any("\ufffd" in tokenizer.decode([t]) for t in tokens)  # the fixture splits characters across tokens
    cycle = ["suffix", "suffix", TARGET, "drafter", "drafter", "drafter", TARGET]
    sources = [cycle[i % len(cycle)] for i in range(len(tokens))]
    spans = token_spans(tokenizer, tokens, sources)
    spans_cover(spans, tokens, sources, tokenizer)
    assert {s.source for s in spans} == {"suffix", "drafter", TARGET}


def test_rendered_race_shows_colours_stats_and_escapes_text(stack):
    _, _, tokenizer = stack
    _, progress, _ = run_race(stack, "Hello world, hello there. Hello world, hello there.", 60, FixedVerifyLength())
    for side in (progress.plain, progress.adaflash):
        spans_cover(token_spans(tokenizer, side.tokens, side.sources), side.tokens, side.sources, tokenizer)
    page = text_html(progress.adaflash, tokenizer)
    assert f'data-finish="{progress.adaflash.finish_reason}"' in page and 'data-source="suffix"' in page
    markup = SimpleNamespace(
        name="plain", tokens=tokenizer.encode("<b>x & y</b>", add_special_tokens=False), finish_reason=None
    )
    markup.sources = [TARGET] * len(markup.tokens)
    assert "&lt;b&gt;x &amp; y&lt;/b&gt;" in text_html(markup, tokenizer) and "<b>" not in text_html(markup, tokenizer)
    stats = stats_html(progress)
    assert "τ (tokens per round)" in stats and "tok/s" in stats
    assert f"{progress.adaflash.tau:.2f}" in stats and f"{progress.speedup:.2f}×" in stats
    assert progress.plain.seconds > 0 and progress.adaflash.seconds > 0
    assert "Identical output: ✓" in stats and progress.first_difference is None
    bars = verify_lens_html(progress.adaflash, "the goodput policy")
    assert (
        f'data-rounds="{progress.adaflash.stats.num_rounds}"' in bars
        and bars.count("<div title=") == progress.adaflash.stats.num_rounds
    )
    progress.adaflash.tokens[5] += 1  # as when a bf16 near-tie rounds differently in verification
    assert progress.first_difference == 5
    assert "part at token 5" in stats_html(progress) and "--dtype fp32" in stats_html(progress)
    del progress.adaflash.tokens[5:]  # a prefix of the other side: different only once both are done
    assert progress.first_difference == 5


def test_opd_status_is_shown():
    status = FakeOPD().status()
    text = opd_markdown(status)
    assert "adapter version **7**" in text and "requests: 40" in text and "tau_history" not in text
    table = tau_history_table(status)
    assert table["requests"].tolist() == [20, 40] and table["tau"].tolist() == [1.75, 2.25]
    assert tau_history_table({"adapter_version": 0}) is None  # before the first evaluation


def test_page_handler_streams_to_the_end_with_opd(stack):
    pytest.importorskip("gradio")
    from adaflash_hf.demo import build_demo

    target, drafter, tokenizer = stack
    demo = build_demo(target, drafter, tokenizer, opd=FakeOPD(), max_new_tokens=30)
    compare = next(f.fn for f in demo.fns.values() if f.name == "compare")
    frames = list(compare("Hello world, hello there.", 30, 0.0))
    plain_html, ada_html, stats, verify_lens, opd_status, tau = frames[-1]
    reference = greedy_reference(target, chat_prompt_ids(tokenizer, "Hello world, hello there."), 30)
    assert f'data-tokens="{len(reference)}"' in plain_html and f'data-tokens="{len(reference)}"' in ada_html
    assert 'data-finish=""' not in plain_html + ada_html
    assert "speed-up" in stats and "Identical output: ✓" in stats and 'data-rounds="0"' not in verify_lens
    assert "adapter version **7**" in opd_status and tau["tau"].tolist() == [1.75, 2.25]
    without = build_demo(target, drafter, tokenizer, max_new_tokens=30)
    frames = list(next(f.fn for f in without.fns.values() if f.name == "compare")("Hi", 5, 0.0))
    assert len(frames[-1]) == 4  # no OPD panel without a worker


def test_user_errors_say_what_to_do(monkeypatch, capsys):
    with pytest.raises(ValueError, match="choose one of auto, bf16, fp16, fp32"):
        DemoArgs(dtype="int8")
    with pytest.raises(ValueError, match="1..65535"):
        DemoArgs(port=70000)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(ValueError, match=f"cannot listen on 127.0.0.1:{port}.*--port"):
            check_port_free("127.0.0.1", port)
        pytest.importorskip("gradio")
        assert main(["demo", "--port", str(port)]) == 2  # before any model is loaded
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("error: cannot listen on") and "--port" in err
    monkeypatch.setitem(sys.modules, "gradio", None)  # as if the demo extra were not installed
    assert main(["demo"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "pip install 'adaflash-hf[demo]'" in err
