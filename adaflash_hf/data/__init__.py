"""Prompt sets and text corpora for training and evaluating drafters, usable without the Hub.

:mod:`adaflash_hf.data.corpora` fetches and parses the offline corpora; :mod:`adaflash_hf.data.prompts`
turns them into per-domain prompt sets and text chunks with fixed train/eval splits;
:mod:`adaflash_hf.data.user_prompts` holds the schema and validates user prompt sets into it;
:mod:`adaflash_hf.data.instruct_prompts` writes and loads the shipped general assistant requests
(``instruct_prompts.jsonl``).
"""

from .instruct_prompts import INSTRUCT_PROMPTS_FILE, load_instruct_prompts
from .prompts import (
    DEFAULT_TRAIN_DOMAINS,
    DOMAINS,
    EVAL_FRACTION,
    EVAL_PROMPTS_PER_DOMAIN,
    HELD_OUT_DOMAINS,
    document_split,
    eval_half,
    gsm8k_prompt,
    humaneval_prompt,
    load_prompts,
    load_text_corpus,
)
from .user_prompts import PROMPT_FEATURES, TEXT_FEATURES, as_prompt_dataset, load_prompts_jsonl

__all__ = [
    "DEFAULT_TRAIN_DOMAINS",
    "DOMAINS",
    "EVAL_FRACTION",
    "EVAL_PROMPTS_PER_DOMAIN",
    "HELD_OUT_DOMAINS",
    "INSTRUCT_PROMPTS_FILE",
    "PROMPT_FEATURES",
    "TEXT_FEATURES",
    "as_prompt_dataset",
    "benchmark_prompts",
    "document_split",
    "eval_half",
    "gsm8k_prompt",
    "humaneval_prompt",
    "load_instruct_prompts",
    "load_prompts",
    "load_prompts_jsonl",
    "load_text_corpus",
]


def benchmark_prompts(prompts: str, domains: str, num_prompts: int) -> list[dict]:
    """A benchmark's prompt set as ``[{prompt, domain}]``: ``prompts="eval"``, the first ``num_prompts`` held-out
    prompts of each of the comma-separated ``domains``; otherwise the first ``num_prompts`` of a JSONL file."""
    if prompts == "eval":
        rows = []
        for domain in domains.split(","):
            rows += load_prompts(domain.strip(), split="eval", limit_per_domain=num_prompts).to_list()
        return [{"prompt": r["prompt"], "domain": r["domain"]} for r in rows]
    return load_prompts_jsonl(prompts).select_columns(["prompt", "domain"]).to_list()[:num_prompts]
