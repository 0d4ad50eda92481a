"""Helpers shared by the session probes in this folder (run them from the repository root, with ``results`` on the path:
``python results/sessionN/probe.py``; each probe adds it)."""
import asyncio

from adaflash_hf.serving.loadtest import serve_while
from adaflash_hf.serving.scheduler import RequestParams


def run_load(scheduler, prompts, concurrency: int, max_new_tokens: int):
    """Serve ``prompts`` (token ids) through ``scheduler`` without HTTP, ``concurrency`` at a time; their outputs."""

    async def main():
        gate = asyncio.Semaphore(concurrency)

        async def one(prompt):
            async with gate:
                return await scheduler.submit(prompt, RequestParams(max_new_tokens=max_new_tokens)).collect()

        return await asyncio.gather(*(one(p) for p in prompts))

    return serve_while(scheduler, main)


def load_smollm2():
    """The bundled SmolLM2-135M target (auto dtype), its tokenizer and drafter, on 2 threads: (target, tokenizer, drafter)."""
    import torch

    from adaflash_hf import load_drafter, load_target

    torch.set_num_threads(2)
    target, tok = load_target("smollm2-135m", dtype="auto")
    return target, tok, load_drafter("auto", target, target_name="smollm2-135m")


def served_batch(method: str, rows: int, target, tok, drafter, max_new_tokens: int = 1000):
    """The engine batch ``method`` is served with (its own scheduler and drafting state), holding the first ``rows``
    concurrency-bench prompts."""
    from adaflash_hf.decoding.state import RowSpec
    from adaflash_hf.prompting import chat_prompt_ids
    from adaflash_hf.serving.loadtest import ConcurrencyBenchArgs, bench_prompts, make_scheduler

    ids = [chat_prompt_ids(tok, p) for p in bench_prompts(ConcurrencyBenchArgs())][:rows]
    batch = make_scheduler(method, target, drafter, tok, 32, "smollm2-135m").batch
    batch.add_rows([RowSpec(i, p, max_new_tokens) for i, p in enumerate(ids)])
    return batch


def interleaved_rounds(batch, switch, modes=("a", "b"), warm_up: int = 5, blocks: int = 4, rounds: int = 6) -> dict:
    """Median seconds of ``batch.step()`` per mode, in interleaved blocks of rounds (``switch(mode)`` sets one up), so a
    drifting machine weighs on every mode alike."""
    import statistics
    import time

    import torch

    times = {mode: [] for mode in modes}
    with torch.no_grad():
        for _ in range(warm_up):
            batch.step()
        for _ in range(blocks):
            for mode in modes:
                switch(mode)
                for _ in range(rounds):
                    start = time.perf_counter()
                    batch.step()
                    times[mode].append(time.perf_counter() - start)
    return {mode: statistics.median(t) for mode, t in times.items()}


def hook_ab(module, attribute: str, off, modes: tuple[str, str], default_methods: list[str]) -> None:
    """A/B probe of one module-level hook the engine looks up at each round: served rounds with
    ``module.<attribute>`` replaced by ``off`` (``modes[0]``) and as shipped (``modes[1]``), in interleaved blocks;
    ``argv``: [rows] [method ...]."""
    import sys

    target, tok, drafter = load_smollm2()
    rows = int(sys.argv[1]) if len(sys.argv) > 1 else 16
    shipped = getattr(module, attribute)

    def switch(mode):
        setattr(module, attribute, shipped if mode == modes[1] else off)

    for method in sys.argv[2:] or default_methods:
        batch = served_batch(method, rows, target, tok, drafter)
        t = interleaved_rounds(batch, switch, modes)
        switch(modes[1])
        a, b = modes
        print(f"{method:12s} {rows:2d} rows: {a} {t[a] * 1e3:6.1f} ms  {b} {t[b] * 1e3:6.1f} ms  ratio {t[a] / t[b]:.2f}", flush=True)
