"""Training sequences for the drafter and the target features that supervise it.

Two sources of token sequences, both stored as ``TrainingSequence`` (token ids plus the first
supervised position):
- self-distillation: the target answers chat-formatted prompts greedily, in left-padded batches;
  the responses are cached on disk in shards, so an interrupted run resumes where it stopped;
- teacher-forced corpus text: raw text is tokenized and packed into fixed-length windows; labels come
  from one target forward over the window (the target's argmax at every position), which is about
  15x cheaper per token than generating it.

``target_features`` runs that forward: it returns the drafter's context (the selected target layers,
concatenated), the target's greedy labels for every position of a batch and its logits.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from tqdm.auto import tqdm
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from ..prompting import chat_prompt_ids
from .data_configs import GenerateDataConfig

logger = logging.getLogger(__name__)

IGNORE_INDEX = -100


@dataclass
class TrainingSequence:
    """One training sequence: ``input_ids`` (L,) and ``start``, the first supervised position.

    Tokens at positions >= start are the target's own predictions (a response) or teacher-forced
    text whose labels come from the target; tokens before start are prompt context only.
    """

    input_ids: torch.Tensor
    start: int

    def __len__(self) -> int:
        return int(self.input_ids.shape[0])


@dataclass
class Batch:
    """Right-padded batch: input_ids, attention_mask and label_mask, all (b, L)."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    label_mask: torch.Tensor

    @property
    def num_supervised(self) -> int:
        return int(self.label_mask.sum())


def collate(sequences: list[TrainingSequence], pad_token_id: int) -> Batch:
    """Right-pad sequences into a :class:`Batch`; label_mask is True at positions start..len-1."""
    length = max(len(s) for s in sequences)
    input_ids = torch.full((len(sequences), length), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros(len(sequences), length, dtype=torch.long)
    label_mask = torch.zeros(len(sequences), length, dtype=torch.bool)
    for row, seq in enumerate(sequences):
        n = len(seq)
        input_ids[row, :n] = seq.input_ids
        attention_mask[row, :n] = 1
        label_mask[row, max(seq.start, 1) : n] = True
    return Batch(input_ids, attention_mask, label_mask)


@dataclass
class TargetFeatures:
    """What one frozen target forward gives the drafter's training step.

    context (b, L, n*H): the selected target layers, concatenated. labels (b, L): ``labels[:, t]`` is
    the target's argmax at position t - 1, i.e. its greedy choice for token t (``IGNORE_INDEX`` at 0).
    logits (b, L, V): the target's logits; ``logits[:, t - 1]`` is the distribution behind ``labels[:, t]``.
    """

    context: torch.Tensor
    labels: torch.Tensor
    logits: torch.Tensor


@torch.no_grad()
def target_features(target: PreTrainedModel, batch: Batch, layer_ids: list[int]) -> TargetFeatures:
    """One frozen target forward over a batch; layer i of ``layer_ids`` is ``hidden_states[i + 1]``."""
    device = target.device
    out = target(
        input_ids=batch.input_ids.to(device),
        attention_mask=batch.attention_mask.to(device),
        output_hidden_states=True,
        use_cache=False,
    )
    context = torch.cat([out.hidden_states[i + 1] for i in layer_ids], dim=-1)  # (b, L, n*H)
    labels = torch.full_like(batch.input_ids, IGNORE_INDEX, device=device)
    labels[:, 1:] = out.logits[:, :-1].max(-1).indices  # argmax; max() is ~2.5x faster on bf16 CPU tensors
    return TargetFeatures(context, labels, out.logits)


def pack_corpus(tokenizer: PreTrainedTokenizerBase, texts: list[str], seq_len: int) -> list[TrainingSequence]:
    """Tokenize texts, join them with EOS and cut the stream into windows of ``seq_len`` tokens."""
    if seq_len < 4:
        raise ValueError(f"seq_len must be >= 4, got {seq_len}.")
    eos = tokenizer.eos_token_id
    stream: list[int] = []
    for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]:
        stream.extend(ids)
        stream.append(eos)
    windows = torch.tensor(stream[: len(stream) // seq_len * seq_len], dtype=torch.long).view(-1, seq_len)  # (n, L)
    return [TrainingSequence(w.clone(), 1) for w in windows]


def _cache_key(
    prompts: list[str], max_new_tokens: int, max_prompt_tokens: int, target_name: str, sampling: tuple = ()
) -> str:
    """Folder name of a prompt set's responses; ``sampling`` (temperature, sample index) is empty for greedy ones."""
    digest = hashlib.sha256()
    for text in (target_name, str(max_new_tokens), str(max_prompt_tokens), *map(str, sampling), *prompts):
        digest.update(text.encode())
        digest.update(b"\0")
    return digest.hexdigest()[:16]


def _write_shard(path: Path, records: list[tuple[list[int], int]]) -> None:
    """Atomically write ``(ids, start)`` records as one safetensors file of flat int32 ids."""
    flat = [t for ids, _ in records for t in ids]
    tensors = {
        "ids": torch.tensor(flat, dtype=torch.int32),
        "lengths": torch.tensor([len(ids) for ids, _ in records], dtype=torch.int64),
        "starts": torch.tensor([start for _, start in records], dtype=torch.int64),
    }
    tmp = path.with_suffix(".tmp")
    save_file(tensors, str(tmp))
    tmp.replace(path)


def _read_shard(path: Path) -> list[TrainingSequence]:
    tensors = load_file(str(path))
    pieces = torch.split(tensors["ids"].long(), tensors["lengths"].tolist())
    return [TrainingSequence(ids, int(start)) for ids, start in zip(pieces, tensors["starts"].tolist())]


def _left_pad(rows: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(r) for r in rows)
    input_ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    attention_mask = torch.zeros(len(rows), width, dtype=torch.long)
    for r, ids in enumerate(rows):
        input_ids[r, width - len(ids) :] = torch.tensor(ids)
        attention_mask[r, width - len(ids) :] = 1
    return input_ids, attention_mask


@torch.no_grad()
def generate_responses(
    target: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    prompts: list[str],
    cache_dir: str | Path,
    max_new_tokens: int = 256,
    batch_size: int = 16,
    max_prompt_tokens: int = 512,
    shard_size: int = 64,
    target_name: str = "",
    drafter=None,
    max_minutes: float | None = None,
    temperature: float = 0.0,
    sample_index: int = 0,
) -> list[TrainingSequence]:
    """Greedy responses of ``target`` to chat-formatted ``prompts``, cached as shards under ``cache_dir``.

    Prompts longer than ``max_prompt_tokens`` are skipped. Each shard (``shard_size`` prompts) is
    written atomically once generated (``shard_NNNNN.safetensors``: flat int32 token ids, lengths and
    starts), and ``meta.json`` records what produced them; a rerun loads finished shards and generates
    only the rest. A sequence is ``prompt + response`` up to and including the first EOS, with
    ``start`` = prompt length. With ``drafter``, generation runs through adaflash-hf's batched
    speculative engine (the target's own greedy tokens, faster). ``max_minutes`` stops generating
    after the shard that crosses the budget and returns what is cached so far (a later call resumes).
    """
    from .. import __version__

    sampling = (temperature, sample_index) if temperature > 0 else ()
    cache_dir = Path(cache_dir) / _cache_key(prompts, max_new_tokens, max_prompt_tokens, target_name, sampling)
    cache_dir.mkdir(parents=True, exist_ok=True)
    meta_path = cache_dir / "meta.json"
    written = meta_path.read_text() if meta_path.exists() else None
    meta = json.loads(written) if written is not None else {}
    meta.update(
        {
            "num_prompts": len(prompts),
            "max_new_tokens": max_new_tokens,
            "max_prompt_tokens": max_prompt_tokens,
            "target": target_name,
            "decoding": f"sampled at temperature {temperature} (sample {sample_index})" if sampling else "greedy",
            "shard_size": shard_size,
        }
    )
    meta.setdefault("shards", {})
    encoded = [chat_prompt_ids(tokenizer, p) for p in prompts]
    eos_ids = set(torch.tensor(target.generation_config.eos_token_id).flatten().tolist())
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else min(eos_ids)
    sequences: list[TrainingSequence] = []
    num_shards = (len(prompts) + shard_size - 1) // shard_size
    start_time = time.perf_counter()
    bar = tqdm(total=len(prompts), desc="self-distillation", unit="prompt")
    for shard in range(num_shards):
        path = cache_dir / f"shard_{shard:05d}.safetensors"
        indices = range(shard * shard_size, min((shard + 1) * shard_size, len(prompts)))
        if path.exists():
            sequences.extend(_read_shard(path))
            bar.update(len(indices))
            continue
        out_of_time = max_minutes is not None and (time.perf_counter() - start_time) / 60 >= max_minutes
        if out_of_time:
            continue
        shard_start = time.perf_counter()
        decoding = dict(do_sample=False)
        if sampling:  # one seed per (sample, shard): a resumed run samples what an uninterrupted one would
            torch.manual_seed(hash((sample_index, shard)) % 2**31)
            decoding = dict(do_sample=True, temperature=temperature, top_k=None, top_p=None)
        kept = sorted((i for i in indices if len(encoded[i]) <= max_prompt_tokens), key=lambda i: len(encoded[i]))
        records: list[tuple[list[int], int]] = []
        for lo in range(0, len(kept), batch_size):
            rows = [encoded[i] for i in kept[lo : lo + batch_size]]
            input_ids, attention_mask = _left_pad(rows, pad_id)
            input_ids, attention_mask = input_ids.to(target.device), attention_mask.to(target.device)
            if drafter is None:
                out = target.generate(
                    input_ids=input_ids,
                    attention_mask=attention_mask,
                    max_new_tokens=max_new_tokens,
                    **decoding,
                    pad_token_id=pad_id,
                ).cpu()
            else:
                from ..decoding.engine import generate

                out = generate(
                    target,
                    drafter,
                    input_ids,
                    attention_mask,
                    max_new_tokens=max_new_tokens,
                    pad_token_id=pad_id,
                    **decoding,
                ).sequences.cpu()
            for r, ids in enumerate(rows):
                response = out[r, input_ids.shape[1] :].tolist()
                end = next((j + 1 for j, t in enumerate(response) if t in eos_ids), len(response))
                records.append((ids + response[:end], len(ids)))
            bar.update(len(rows))
        bar.update(len(indices) - len(kept))
        _write_shard(path, records)
        meta["shards"][path.name] = {
            "prompts": len(records),
            "response_tokens": sum(len(ids) - s for ids, s in records),
            "seconds": round(time.perf_counter() - shard_start, 1),
            "engine": "adaflash" if drafter is not None else "generate",
            "dtype": str(target.dtype),
            "adaflash_hf": __version__,
            "written": time.strftime("%Y-%m-%dT%H:%M:%S"),
        }
        meta_path.write_text(json.dumps(meta, indent=1))
        sequences.extend(TrainingSequence(torch.tensor(ids), s) for ids, s in records)
    bar.close()
    if json.dumps(meta, indent=1) != written:  # unchanged: left alone, as other processes may be reading it
        meta_path.write_text(json.dumps(meta, indent=1))
    logger.info(
        "self-distillation: %d sequences, %d response tokens (%d of %d shards cached)",
        len(sequences),
        sum(len(s) - s.start for s in sequences),
        len(meta["shards"]),
        num_shards,
    )
    return sequences


def generate_data(config: GenerateDataConfig) -> int:
    """Run :func:`generate_responses` over the training prompts train-drafter would use; resumable."""
    from ..data import load_prompts, load_prompts_jsonl
    from ..drafters import load_drafter
    from ..targets import load_target

    if config.prompts is not None:  # read (and check) the user's prompts before loading any model
        prompts = _first_per_domain(
            load_prompts_jsonl(config.prompts, default_domain="user"), config.prompts_per_domain
        )
    else:
        prompts = load_prompts(
            config.train_domains, split="train", limit_per_domain=config.prompts_per_domain, seed=config.seed
        )
    if config.num_threads is not None:
        torch.set_num_threads(config.num_threads)
    target, tokenizer = load_target(config.target, dtype=config.target_dtype)
    drafter = None if config.drafter == "none" else load_drafter(config.drafter, target, target_name=config.target)
    start = time.perf_counter()
    sequences = []
    for sample in range(config.samples_per_prompt if config.temperature > 0 else 1):
        left = None if config.max_minutes is None else config.max_minutes - (time.perf_counter() - start) / 60
        sequences += generate_responses(
            target,
            tokenizer,
            list(prompts["prompt"]),
            Path(config.data_dir) / "train",
            max_new_tokens=config.max_new_tokens,
            batch_size=config.batch_size,
            target_name=config.target,
            drafter=drafter,
            max_minutes=left if left is None or left > 0 else 1e-9,
            temperature=config.temperature,
            sample_index=sample,
        )
    print(
        f"{len(sequences)} sequences, {sum(len(s) - s.start for s in sequences)} response tokens cached "
        f"(of {len(prompts)} prompts) in {config.data_dir}/train"
    )
    return 0


def _first_per_domain(prompts, limit: int):
    """The first ``limit`` prompts of each domain of a prompt dataset, in file order."""
    seen: dict[str, int] = {}
    keep = []
    for i, domain in enumerate(prompts["domain"]):
        seen[domain] = seen.get(domain, 0) + 1
        if seen[domain] <= limit:
            keep.append(i)
    return prompts.select(keep)
