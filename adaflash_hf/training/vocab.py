"""What a drafter learns from the target's own outputs besides its weights: a reduced draft vocabulary
(the most frequent output tokens, FR-Spec / EAGLE-3) and a datastore of those outputs for suffix matches.

The drafter's logits are computed over these token ids only, which cuts the lm_head, its main
cost at inference and in training. Verification stays over the full vocabulary, so decoding stays
lossless; a token outside the draft vocabulary simply can never be drafted. The size is chosen from
measured coverage: the share of the target's own held-out output tokens that fall inside.

``adaflash prepare-drafter`` counts response tokens of cached self-generated data, prints coverage
for a range of sizes on held-out responses, and writes a drafter folder that carries the chosen list
and ``datastore.safetensors`` (the responses as token ids; the engine's ``datastore`` draft source).
"""

from __future__ import annotations

import json
import random
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

import torch

from .data import TrainingSequence, _read_shard
from .data_configs import PrepareDrafterConfig


def response_token_counts(sequences: Iterable[TrainingSequence]) -> Counter:
    """How often each token id occurs in the responses (positions >= start) of ``sequences``."""
    counts: Counter = Counter()
    for seq in sequences:
        counts.update(seq.input_ids[seq.start :].tolist())
    return counts


def most_frequent(counts: Counter, size: int, vocab_size: int, always: Iterable[int] = ()) -> torch.Tensor:
    """The ``size`` most frequent ids (ties by id), always including ``always`` (e.g. EOS), then unseen ids
    in id order if fewer than ``size`` were seen; sorted by id."""
    keep = dict.fromkeys(int(t) for t in always)
    for token, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])):
        if len(keep) >= size:
            break
        keep.setdefault(token)
    unseen = (t for t in range(vocab_size) if t not in keep)
    while len(keep) < size:
        keep.setdefault(next(unseen))
    return torch.tensor(sorted(list(keep)[:size]), dtype=torch.long)


def coverage(vocab: torch.Tensor, counts: Counter) -> float:
    """Share of the tokens counted in ``counts`` whose id is in ``vocab``."""
    total = sum(counts.values())
    inside = set(vocab.tolist())
    return sum(c for t, c in counts.items() if t in inside) / total if total else 0.0


def read_cached_sequences(data_dir: str | Path, greedy_only: bool = False) -> list[TrainingSequence]:
    """Every sequence in the shard caches under ``data_dir`` (any prompt set, any target run); ``greedy_only``: only
    the sets of the target's greedy answers, leaving out sampled ones (``generate-data --temperature``)."""
    paths = sorted(Path(data_dir).rglob("shard_*.safetensors"))
    if greedy_only:
        greedy = {folder for folder in {path.parent for path in paths} if _decoding(folder) == "greedy"}
        paths = [path for path in paths if path.parent in greedy]
    return [s for path in paths for s in _read_shard(path)]


def _decoding(folder: Path) -> str:
    """How a cached prompt set's answers were decoded, from its ``meta.json`` (greedy where it does not say)."""
    meta = folder / "meta.json"
    return json.loads(meta.read_text()).get("decoding", "greedy") if meta.is_file() else "greedy"


SIZES = (1024, 2048, 4096, 8192, 12288, 16384, 24576, 32768, 49152, 65536)


@torch.no_grad()
def corpus_prediction_counts(
    target, tokenizer, domains: list[str], num_tokens: int, seq_len: int = 512
) -> tuple[Counter, Counter]:
    """The target's greedy predictions on ``num_tokens`` of training corpus text (one forward per window),
    counted as (train, held-out) with every tenth window held out: a cheap stand-in for its outputs."""
    from ..data import load_text_corpus
    from .data import collate, pack_corpus

    texts = list(load_text_corpus(domains, split="train")["text"])
    random.Random(0).shuffle(texts)  # a sample across domains and documents
    picked, words = [], 0
    for text in texts:  # ~1.5 tokens per word: tokenize only what is needed
        picked.append(text)
        words += len(text.split())
        if words * 1.5 >= num_tokens:
            break
    windows = pack_corpus(tokenizer, picked, seq_len)[: max(1, num_tokens // seq_len)]
    counts, held_out = Counter(), Counter()
    for i, window in enumerate(windows):
        batch = collate([window], tokenizer.pad_token_id or 0)
        logits = target(input_ids=batch.input_ids.to(target.device), use_cache=False, logits_to_keep=0).logits
        (held_out if i % 10 == 9 else counts).update(logits[0].max(-1).indices.tolist())
    return counts, held_out


def pick_retention_samples(
    sequences,
    count: int = 48,
    max_prompt_tokens: int = 384,
    max_response_tokens: int = 128,
    min_response_tokens: int = 16,
) -> list[tuple[list[int], int]]:
    """``count`` (prompt + response cut to ``max_response_tokens``, prompt length) samples spread evenly over
    cached training sequences (``TrainingSequence``: input_ids, start), for OPD's retention check."""
    from ..data.excerpts import spread_evenly

    usable = [
        s for s in sequences if s.start <= max_prompt_tokens and len(s.input_ids) - s.start >= min_response_tokens
    ]
    return [(s.input_ids[: s.start + max_response_tokens].tolist(), int(s.start)) for s in spread_evenly(usable, count)]


def run_prepare_drafter(config: PrepareDrafterConfig) -> int:
    from ..decoding.acceptance import PRIOR_FILE
    from ..decoding.datastore_file import DATASTORE_FILE, save_datastore
    from ..drafters import load_drafter
    from ..targets import load_target

    target, tokenizer = load_target(config.target, dtype="bf16")
    drafter = load_drafter(config.drafter, target, target_name=config.target, datastore=False)  # rebuilt here
    # the target's greedy answers only: the datastore is matched against what greedy decoding will produce, and
    # the acceptance prior's prompts are decoded greedily against their own greedy answers
    train = read_cached_sequences(Path(config.data_dir) / "train", greedy_only=True) if config.data_dir else []
    responses = [s.input_ids[s.start :].tolist() for s in train]
    if not train and not config.corpus_tokens:
        raise ValueError(
            f"no cached greedy responses under {config.data_dir}/train (sampled sets are not read here): run "
            f"`adaflash generate-data --data-dir {config.data_dir}` first, or count the target's predictions on "
            "corpus text with --corpus-tokens N."
        )
    held_out = read_cached_sequences(Path(config.data_dir) / "eval") if config.data_dir else []
    if train and not held_out:  # no eval cache: hold out every tenth training response
        train, held_out = [s for i, s in enumerate(train) if i % 10], train[::10]
    counts, eval_counts = response_token_counts(train), response_token_counts(held_out)
    if config.corpus_tokens:
        corpus_counts, corpus_held_out = corpus_prediction_counts(
            target, tokenizer, ["code", "math", "chat"], config.corpus_tokens
        )
        counts.update(corpus_counts)
        eval_counts.update(corpus_held_out)
    vocab_size = drafter.config.vocab_size
    always = [t for t in torch.tensor(target.generation_config.eos_token_id).flatten().tolist()]
    table = []
    for size in [s for s in SIZES if s < vocab_size] + [vocab_size]:
        table.append(
            {
                "size": size,
                "heldout_coverage": round(coverage(most_frequent(counts, size, vocab_size, always), eval_counts), 5),
            }
        )
    print(f"{sum(counts.values())} counted tokens ({len(counts)} distinct), {sum(eval_counts.values())} held-out")
    print(f"{'size':>7} {'held-out coverage':>18}")
    for row in table:
        print(f"{row['size']:>7} {row['heldout_coverage']:>18.4f}")
    size = config.size or next(
        r["size"] for r in table if r["heldout_coverage"] >= config.min_coverage or r["size"] == vocab_size
    )
    if config.keep_vocab:
        size = drafter.config.draft_vocab_size or vocab_size
        kept = drafter.draft_vocab.cpu() if drafter.draft_vocab is not None else torch.arange(vocab_size)
        kept_coverage = round(coverage(kept, eval_counts), 5)
        print(f"keeping the drafter's draft vocabulary of {size} tokens: held-out coverage {kept_coverage:.4f}")
    elif (
        size >= vocab_size and config.size is None and len(table) > 1
    ):  # keep the counting's work: take the largest tried size
        size = table[-2]["size"]
        print(
            f"note: no size below the whole vocabulary reaches held-out coverage {config.min_coverage} with this much "
            f"data; "
            f"using {size} ({table[-2]['heldout_coverage']:.2%}). Count more tokens, or pass --size."
        )
    if not config.keep_vocab:
        drafter.set_draft_vocab(most_frequent(counts, size, vocab_size, always))
    out = Path(config.output_dir)
    drafter.save_pretrained(out)
    write_datastore = config.datastore and bool(responses)
    retention = pick_retention_samples(train)
    (out / "draft_vocab.json").write_text(
        json.dumps(
            {
                "size": size,
                "heldout_coverage": (
                    kept_coverage
                    if config.keep_vocab
                    else next(
                        (r["heldout_coverage"] for r in table if r["size"] == size),
                        round(coverage(drafter.draft_vocab.cpu(), eval_counts), 5),
                    )
                ),
                "kept_vocab": config.keep_vocab,
                "counted_tokens": sum(counts.values()),
                "heldout_tokens": sum(eval_counts.values()),
                "response_tokens": sum(map(len, responses)),
                "corpus_prediction_tokens": config.corpus_tokens,
                "datastore_tokens": sum(map(len, responses)) if write_datastore else 0,
                "coverage_table": table,
                "data_dir": config.data_dir,
                "retention_samples": len(retention),
            },
            indent=1,
        )
        + "\n"
    )
    if write_datastore:
        save_datastore(responses, out / DATASTORE_FILE)
    if retention:
        from ..drafters import RETENTION_FILE, save_retention_samples

        save_retention_samples(retention, out / RETENTION_FILE)
        print(
            f"wrote {len(retention)} retention samples (prompts with their responses, for OPD's check) to "
            f"{out / RETENTION_FILE}"
        )
    print(
        f"wrote {out} with a draft vocabulary of {size} tokens"
        + (f" and a datastore of {sum(map(len, responses))} response tokens" if write_datastore else "")
    )
    if config.acceptance_prompts:
        prior = learn_acceptance_prior(
            target,
            drafter,
            train[-config.acceptance_prompts :],
            responses,
            config.acceptance_tokens,
            tokenizer.pad_token_id,
        )
        (out / PRIOR_FILE).write_text(json.dumps(prior) + "\n")
        print(
            f"wrote {out / PRIOR_FILE}: acceptance counts for {len(prior['entries'])} features from "
            f"{prior['prompts']} held-out training prompts"
        )
    return 0


@torch.inference_mode()
def learn_acceptance_prior(
    target,
    drafter,
    sequences: list[TrainingSequence],
    responses: list[list[int]],
    max_new_tokens: int,
    pad_token_id: int | None,
) -> dict:
    """The acceptance rates the engine learns decoding ``sequences``' prompts greedily, exported for
    ``acceptance_prior.json``.

    Those prompts' own responses leave the datastore for this run (otherwise every datastore match would be
    a perfect copy and its rates far too high); the drafter keeps its draft vocabulary and the default
    drafting configuration, so the features are the ones live traffic produces.
    """
    from tqdm.auto import tqdm

    from ..decoding.drafting_state import DraftingState
    from ..decoding.engine import generate
    from ..decoding.ngram_index import NGramIndex

    if not sequences:
        raise ValueError(
            "acceptance_prompts needs cached training responses under data_dir/train: run `adaflash generate-data` "
            "first."
        )
    held = {tuple(s.input_ids[s.start :].tolist()) for s in sequences}
    datastore = NGramIndex()
    for stream in responses:
        if tuple(stream) not in held:
            datastore.start_stream(stream)
    drafter.adaflash_datastore = datastore
    state = DraftingState()
    try:
        for s in tqdm(sequences, desc="acceptance prior", unit="prompt"):
            prompt = s.input_ids[None, : s.start].to(target.device)
            generate(
                target,
                drafter,
                prompt,
                torch.ones_like(prompt),
                max_new_tokens=max_new_tokens,
                do_sample=False,
                pad_token_id=pad_token_id,
                drafting_state=state,
            )
    finally:
        del drafter.adaflash_datastore
    return {**state.estimator.export(), "prompts": len(sequences), "max_new_tokens": max_new_tokens}
