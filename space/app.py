"""Hugging Face Space: ``adaflash demo`` on the embedded default (bundled SmolLM2-135M target, drafter and
length head, on CPU). Locally, ``python app.py`` serves it on http://127.0.0.1:7860 like ``adaflash demo``."""

import logging
import os

from adaflash_hf.demo import DemoArgs, run_demo

if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    on_space = "SPACE_ID" in os.environ  # set by Hugging Face Spaces, whose proxy reaches the app on 0.0.0.0:7860
    # fp32: greedy texts agree token for token (bf16 may part at near-ties of the target's logits)
    run_demo(DemoArgs(host="0.0.0.0" if on_space else "127.0.0.1", dtype="fp32"))
