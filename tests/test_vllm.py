"""Opt-in: the drafters exported for vLLM, checked in vLLM itself (python -m pytest -m vllm tests/test_vllm.py).

Needs the vLLM environment of ``adaflash setup-vllm`` (or ``ADAFLASH_VLLM_PYTHON``); without one the tests skip,
unless ``ADAFLASH_REQUIRE_VLLM=1`` makes that a failure. Each vLLM run is a process of its own (about a minute to
start on a CPU). The SmolLM2 checks take 2-3 minutes on 2 cores; the Qwen2.5-Coder-1.5B export also needs
``-m 'vllm and real_model'`` and its converted preset already cached.

Greedy decoding runs in fp32: in bf16, vLLM's speculative outputs already differ from its own plain ones at
near-ties (2 of 4 held-out SmolLM2 prompts at 64 tokens), while in fp32 plain vLLM, vLLM with the drafter,
transformers and adaflash-hf's engine agree token for token.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from adaflash_hf._pypi import cache_home
from adaflash_hf.drafters import BUNDLED_DIR, LENGTH_HEAD_SUFFIX
from adaflash_hf.targets import DEFAULT_TARGET, MARKER
from adaflash_hf.vllm_env import (
    dflash_speculative_config,
    drafter_tau,
    export_for_vllm,
    find_vllm_python,
    run_vllm,
    server_command,
)

pytestmark = pytest.mark.vllm

REQUIRE = "ADAFLASH_REQUIRE_VLLM"
MAX_TOKENS = 32
TAU_TOLERANCE = 0.05
BUNDLED = sorted(
    p.parent.name for p in BUNDLED_DIR.glob("*/config.json") if not p.parent.name.endswith(LENGTH_HEAD_SUFFIX)
)


@pytest.fixture(scope="module")
def vllm_python() -> Path:
    try:
        return find_vllm_python()
    except FileNotFoundError as error:
        if os.environ.get(REQUIRE) == "1":
            pytest.fail(f"{REQUIRE}=1 but: {error}")
        pytest.skip(f"no vLLM environment ({error})")


def held_out_prompts(tokenizer_dir: Path, count: int) -> list[list[int]]:
    """Token ids of the first held-out prompts of the code and math domains, through the chat template."""
    from transformers import AutoTokenizer

    from adaflash_hf.data import load_prompts
    from adaflash_hf.prompting import chat_prompt_ids

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    rows = load_prompts(["code", "math"], split="eval", limit_per_domain=count).to_list()
    return [chat_prompt_ids(tokenizer, row["prompt"]) for row in rows]


@pytest.fixture(scope="module")
def exported(vllm_python, tmp_path_factory):
    """name -> (target folder, drafter export, block size, prompts, plain vLLM result, vLLM + drafter result)."""
    done = {}

    def get(name: str):
        if name not in done:
            target_dir, drafter_dir, block = export_for_vllm(name, "auto", tmp_path_factory.mktemp(name), dtype="fp32")
            prompts = held_out_prompts(target_dir, 1)
            spec = dict(model=str(target_dir), prompts=prompts, max_tokens=MAX_TOKENS, dtype="float32", max_num_seqs=4)
            plain = run_vllm({**spec, "modes": ["batch1"]}, python=vllm_python)
            config = dflash_speculative_config(drafter_dir, block)
            drafted = run_vllm({**spec, "speculative_config": config}, python=vllm_python)
            done[name] = target_dir, drafter_dir, block, prompts, plain, drafted
        return done[name]

    return get


@pytest.mark.parametrize(
    "name",
    [pytest.param(name, marks=[] if name == DEFAULT_TARGET else [pytest.mark.real_model]) for name in BUNDLED],
)
def test_bundled_drafter_export_is_lossless_in_vllm(exported, name):
    """vLLM with the exported drafter writes plain vLLM's greedy outputs, one request at a time and all at once."""
    if name != DEFAULT_TARGET and not (cache_home() / "models" / name / MARKER).is_file():
        pytest.skip(f"preset {name} is not converted yet (load it once: adaflash generate --target {name})")
    _, _, block, prompts, plain, drafted = exported(name)
    reference = plain["modes"]["batch1"]["outputs"]
    assert all(reference)
    assert drafted["modes"]["batch1"]["outputs"] == reference
    assert drafted["modes"]["concurrent"]["outputs"] == reference
    spec = drafted["modes"]["batch1"]["spec"]
    assert spec["num_drafts"] > 0 and spec["num_draft_tokens"] == spec["num_drafts"] * (block - 1)
    assert len(spec["num_accepted_tokens_per_pos"]) == block - 1


def test_vllm_acceptance_matches_the_engine(exported):
    """vLLM's tau (1 + accepted / drafts) equals the drafter's own tau in adaflash-hf's engine on the same prompts.

    Both verify the drafter's whole block greedily every round, so in fp32 they take the same rounds and accept
    the same drafts (measured equal: 23 + 15 rounds on these prompts at 32 tokens; tau 1.2990 over 194 rounds on
    4 prompts x 64 tokens). One difference is bookkeeping: vLLM also counts the drafts accepted in a request's
    last step past ``max_tokens`` (or EOS), where its output is cut, while the engine drafts no further than the
    budget, so that overshoot is taken off vLLM's count here. The tolerance of 0.05 leaves room for a few
    rounding-order near-ties in the drafter's argmax (each moves tau by one accepted token over the rounds,
    about 0.03 here); a real export fault (wrong target layers, mask token or block size) drops the drafter's
    acceptance to near 1.0, a difference of 0.3 or more on these prompts.
    """
    from adaflash_hf.drafters import load_drafter
    from adaflash_hf.targets import load_target

    _, drafter_dir, _, prompts, plain, drafted = exported(DEFAULT_TARGET)
    target, _ = load_target(DEFAULT_TARGET, dtype="fp32")
    drafter = load_drafter(str(drafter_dir), target, datastore=False)  # the very weights vLLM loaded
    ours = drafter_tau(target, drafter, prompts, MAX_TOKENS)
    assert ours["outputs"] == plain["modes"]["batch1"]["outputs"]
    theirs = drafted["modes"]["batch1"]
    counts = theirs["drafts_and_accepted_per_prompt"]
    drafts = sum(d for d, _ in counts)
    within = sum(min(a, len(out) - 1 - d) for (d, a), out in zip(counts, theirs["outputs"]))  # cut: 1 + d + a tokens
    assert drafts == theirs["spec"]["num_drafts"] and drafts == pytest.approx(ours["rounds"], rel=0.1)
    assert 1 + within / drafts == pytest.approx(ours["tau"], abs=TAU_TOLERANCE), (ours, theirs["spec"])


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def http(url: str, body: dict | None = None, timeout: float = 120) -> str:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return response.read().decode()


def test_the_openai_server_serves_with_the_drafter(exported, vllm_python, tmp_path):
    """`python -m vllm.entrypoints.openai.api_server` with the DFlash config: a completion and /metrics."""
    target_dir, drafter_dir, block, prompts, plain, _ = exported(DEFAULT_TARGET)
    port = free_port()
    command = server_command(
        vllm_python,
        target_dir,
        port,
        dflash_speculative_config(drafter_dir, block),
        dtype="float32",
        max_model_len=1024,
        enforce_eager=True,
    )
    log = tmp_path / "server.log"
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "2"}
    with open(log, "w") as handle:
        server = subprocess.Popen(command, stdout=handle, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 420
        while True:
            assert server.poll() is None, f"the server exited with {server.returncode}:\n{log.read_text()[-3000:]}"
            assert time.monotonic() < deadline, f"the server was not up after 420 s:\n{log.read_text()[-3000:]}"
            try:
                http(f"{base}/health", timeout=5)
                break
            except OSError:
                time.sleep(2)
        body = {"model": str(target_dir), "prompt": prompts[0], "max_tokens": 16, "temperature": 0.0}
        reply = json.loads(http(f"{base}/v1/completions", {**body, "return_token_ids": True}))
        choice = reply["choices"][0]
        assert choice["token_ids"] == plain["modes"]["batch1"]["outputs"][0][:16]
        assert reply["usage"]["completion_tokens"] == 16
        metrics = http(f"{base}/metrics")
        assert "vllm:spec_decode_num_drafts" in metrics
    finally:
        stop(server)


def stop(server: subprocess.Popen) -> None:
    """Stop the server, then any engine process of its own process group that outlived it."""
    server.terminate()
    try:
        server.wait(timeout=60)
    except subprocess.TimeoutExpired:
        server.kill()
        server.wait()
    try:
        os.killpg(server.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
