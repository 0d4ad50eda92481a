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
