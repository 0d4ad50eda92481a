"""Cached target features: the frozen target runs once over the training sequences, and every later step
reads the drafter's context from disk instead of running the target again.

A drafter training step needs, for each training sequence, the hidden states of the target layers the
drafter reads (its context) and the target's greedy token at every position (its labels). Computing
them is one target forward per step, the largest cost of a step on a CPU. This module computes them
once (``adaflash cache-features``) and serves batches of them from memory-mapped files, so a step runs
only the drafter.

Layout of a cache folder::

    meta.json           provenance: target, context layer ids, dtype, hidden size, adaflash-hf version,
                        and per shard its source file (sha256), sequences, tokens, seconds, time written
    shard_NNNNN/        one per source shard of self-generated responses (``adaflash generate-data``)
    corpus_NNNNN/       optional: packed windows of teacher-forced corpus text (``--corpus``), same arrays
        ids.npy         (N,) int32 token ids of every sequence, concatenated
        labels.npy      (N,) int32 the target's argmax at t - 1 for token t (-100 at each sequence's start)
        context.npy     (N, n_layers * H) uint16, the bits of the bf16 hidden states
        offsets.npy     (S + 1,) int64 where each sequence begins in the flat arrays
        starts.npy      (S,) int64 the first response position of each sequence (prompt before it)

Corpus windows cost one target forward per token, about 15 times less than generating a response token, and
their labels are still the target's own argmax; training mixes them with the responses (``train-drafter
--corpus-fraction``). A shard is written to a temporary folder and renamed when complete, so an interrupted run
resumes at the first missing shard. Size: n_layers * H * 2 bytes per token (SmolLM2-135M with 5 layers: 5.8 KB).
"""

from __future__ import annotations

import itertools
import json
import logging
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

from .._pypi import cache_home, sha256_of
from .data import IGNORE_INDEX, Batch, TargetFeatures, TrainingSequence, _read_shard

logger = logging.getLogger(__name__)

FORMAT_VERSION = 1


def default_cache_dir(target_name: str, layer_ids: list[int]) -> Path:
    """``<adaflash cache>/features/<target>-L<ids>``: outside the repository, one folder per context choice."""
    safe = "".join(c if c.isalnum() or c in "-._" else "_" for c in target_name)
    return cache_home() / "features" / f"{safe}-L{'_'.join(map(str, layer_ids))}"


def source_shards(data_dir: str | Path) -> list[Path]:
    """Every shard of self-generated responses under ``DATA_DIR/train`` (all prompt sets), in a fixed order."""
    root = Path(data_dir) / "train"
    shards = sorted(root.glob("*/shard_*.safetensors"))
    if not shards:
        raise FileNotFoundError(
            f"no self-generated responses under {root}: create them with "
            f"`adaflash generate-data --data-dir {data_dir}`."
        )
    return shards


CORPUS_WINDOWS_PER_SHARD = 256  # 512-token windows: 131k tokens, about 0.75 GB of SmolLM2-135M features per shard


def corpus_shards(
    tokenizer, domains: list[str], seq_len: int, seed: int = 0, windows_per_shard: int | None = None
) -> list[list[TrainingSequence]]:
    """The training split's corpus text of ``domains``, packed into ``seq_len``-token windows exactly as
    ``train-drafter`` packs it, in shards of ``windows_per_shard`` windows (a fixed order: same inputs, same shards)."""
    from ..data import load_text_corpus
    from .data import pack_corpus

    texts = load_text_corpus(domains, split="train", seed=seed)
    windows = pack_corpus(tokenizer, list(texts["text"]), seq_len)
    windows_per_shard = windows_per_shard or CORPUS_WINDOWS_PER_SHARD
    return [windows[i : i + windows_per_shard] for i in range(0, len(windows), windows_per_shard)]


def _ids_digest(sequences: list[TrainingSequence]) -> str:
    import hashlib

    digest = hashlib.sha256()
    for sequence in sequences:
        digest.update(sequence.input_ids.to(torch.int32).numpy().tobytes())
        digest.update(int(sequence.start).to_bytes(8, "little"))
    return digest.hexdigest()


@torch.no_grad()
def _shard_features(
    target, sequences: list[TrainingSequence], layer_ids: list[int], pad_token_id: int, batch_size: int
) -> dict[str, np.ndarray]:
    """One target forward per ``batch_size`` sequences (sorted by length to waste little padding)."""
    order = sorted(range(len(sequences)), key=lambda i: len(sequences[i]))
    context: list[torch.Tensor | None] = [None] * len(sequences)
    labels: list[torch.Tensor | None] = [None] * len(sequences)
    for lo in range(0, len(order), batch_size):
        rows = order[lo : lo + batch_size]
        width = max(len(sequences[i]) for i in rows)
        input_ids = torch.full((len(rows), width), pad_token_id, dtype=torch.long)
        attention_mask = torch.zeros(len(rows), width, dtype=torch.long)
        for r, i in enumerate(rows):
            input_ids[r, : len(sequences[i])] = sequences[i].input_ids
            attention_mask[r, : len(sequences[i])] = 1
        out = target(
            input_ids=input_ids.to(target.device),
            attention_mask=attention_mask.to(target.device),
            output_hidden_states=True,
            use_cache=False,
        )
        hidden = torch.cat([out.hidden_states[j + 1] for j in layer_ids], dim=-1).to(torch.bfloat16).cpu()  # (b, L, nH)
        argmax = out.logits.max(-1).indices.cpu()  # (b, L): the target's choice for the next token
        for r, i in enumerate(rows):
            n = len(sequences[i])
            context[i] = hidden[r, :n]
            row_labels = torch.full((n,), IGNORE_INDEX, dtype=torch.int32)
            row_labels[1:] = argmax[r, : n - 1].to(torch.int32)
            labels[i] = row_labels
    lengths = [len(s) for s in sequences]
    return {
        "ids": torch.cat([s.input_ids for s in sequences]).to(torch.int32).numpy(),
        "labels": torch.cat(labels).numpy(),
        "context": torch.cat(context).view(torch.uint16).numpy(),
        "offsets": np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64),
        "starts": np.array([s.start for s in sequences], dtype=np.int64),
    }


def build_feature_cache(
    target,
    tokenizer,
    data_dir: str | Path | None,
    cache_dir: str | Path,
    layer_ids: list[int],
    target_name: str,
    batch_size: int = 8,
    max_minutes: float | None = None,
    corpus_domains: list[str] | None = None,
    seq_len: int = 512,
    seed: int = 0,
) -> Path:
    """Compute (or resume) the feature cache of every self-generated shard under ``DATA_DIR/train`` (None: none),
    then, with ``corpus_domains``, of the training split's corpus text of those domains in ``seq_len``-token
    windows (``corpus_NNNNN`` shards)."""
    from .. import __version__

    cache_dir = Path(cache_dir)
    cache_dir.mkdir(parents=True, exist_ok=True)
    meta_path = cache_dir / "meta.json"
    hidden_size = target.config.get_text_config().hidden_size
    provenance = {
        "format": FORMAT_VERSION,
        "target": target_name,
        "target_layer_ids": list(layer_ids),
        "hidden_size": hidden_size,
        "dtype": "bfloat16",
        "target_dtype": str(target.dtype),
    }
    meta = json.loads(meta_path.read_text()) if meta_path.exists() else {}
    clash = {k: (meta[k], v) for k, v in provenance.items() if k in meta and meta[k] != v}
    if clash:
        raise ValueError(
            f"{cache_dir} holds features of another configuration ({clash}, cached vs asked): "
            "pass another --cache-dir, or delete that folder to rebuild it."
        )
    meta.update(provenance)
    meta.setdefault("shards", {})
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    if data_dir is None and not corpus_domains:
        raise ValueError(
            "nothing to cache: give a data folder of responses (--data-dir), corpus domains (--corpus), or both."
        )
    jobs = []  # (shard name, where it comes from, its digest, a function that reads its sequences, provenance)
    # A response shard keeps the name it was first cached under, and new answer sets take the next free numbers,
    # so adding a set (whose folder may sort anywhere) never renames what is cached.
    named = {entry["source"]: name for name, entry in meta["shards"].items() if name.startswith("shard_")}
    taken = {int(name.split("_")[1]) for name in named.values()}
    free = (n for n in itertools.count() if n not in taken)
    for source in source_shards(data_dir) if data_dir is not None else []:
        label = str(source.relative_to(Path(data_dir)))
        name = named.get(label) or f"shard_{next(free):05d}"
        jobs.append((name, label, sha256_of(source), _read_shard, source, {}))
    if corpus_domains:
        first = 0
        for number, windows in enumerate(corpus_shards(tokenizer, list(corpus_domains), seq_len, seed)):
            provenance_of = {"kind": "corpus", "domains": list(corpus_domains), "seq_len": seq_len, "seed": seed}
            label = f"corpus {'+'.join(corpus_domains)}, windows {first}..{first + len(windows) - 1}"
            first += len(windows)
            jobs.append((f"corpus_{number:05d}", label, _ids_digest(windows), lambda w: w, windows, provenance_of))
    start = time.perf_counter()
    bar = tqdm(jobs, desc="cache target features", unit="shard")
    for name, source_label, digest, read, source, extra in bar:
        done = meta["shards"].get(name)
        if done is not None and (cache_dir / name).is_dir():
            if done["source_sha256"] != digest:
                raise ValueError(
                    f"{cache_dir / name} was computed from another version of {source_label}: "
                    "delete the cache folder to rebuild it."
                )
            continue
        tick = time.perf_counter()
        sequences = read(source)
        arrays = _shard_features(target, sequences, layer_ids, pad_id, batch_size)
        tmp = cache_dir / f"{name}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        for key, array in arrays.items():
            np.save(tmp / f"{key}.npy", array)
        tmp.rename(cache_dir / name)
        seconds = time.perf_counter() - tick
        tokens = int(arrays["offsets"][-1])
        meta["shards"][name] = {
            "kind": extra.get("kind", "response"),
            **{k: v for k, v in extra.items() if k != "kind"},
            "source": source_label,
            "source_sha256": digest,
            "sequences": len(sequences),
            "tokens": tokens,
            "response_tokens": int(sum(len(s) - s.start for s in sequences)),
            "seconds": round(seconds, 1),
            "adaflash_hf": __version__,
            "written": time.strftime("%Y-%m-%dT%H:%M:%S"),
        }
        meta_path.write_text(json.dumps(meta, indent=1))
        bar.set_postfix(tok_per_s=f"{tokens / seconds:.0f}")
        if max_minutes is not None and (time.perf_counter() - start) / 60 >= max_minutes:
            logger.info("time budget of %.1f min reached after %s; rerun to resume", max_minutes, name)
            break
    meta_path.write_text(json.dumps(meta, indent=1))
    return cache_dir


@dataclass
class CachedSequence:
    shard: int
    offset: int
    length: int
    start: int
    kind: str = "response"  # or "corpus"


class FeatureStore:
    """Memory-mapped view of a feature cache: training sequences and the batches of features for them.

    Pages are read from disk as batches touch them, so RAM stays flat however large the cache is.
    """

    def __init__(self, cache_dir: str | Path, max_shards: int | None = None):
        """``max_shards``: read only the first N finished shards, in name order (a run on a cache that has since
        grown sees the data it saw then)."""
        self.cache_dir = Path(cache_dir)
        meta_path = self.cache_dir / "meta.json"
        if not meta_path.exists():
            raise FileNotFoundError(
                f"{self.cache_dir} is not a feature cache (no meta.json): build it with `adaflash cache-features`."
            )
        self.meta = json.loads(meta_path.read_text())
        if self.meta.get("format") != FORMAT_VERSION:
            raise ValueError(
                f"{self.cache_dir} has cache format {self.meta.get('format')}, this version reads "
                f"{FORMAT_VERSION}: rebuild it with `adaflash cache-features`."
            )
        self.layer_ids: list[int] = list(self.meta["target_layer_ids"])
        self._shards: list[dict[str, np.ndarray]] = []
        self.sequences: list[CachedSequence] = []
        for name in sorted(self.meta["shards"]):
            folder = self.cache_dir / name
            if not folder.is_dir():
                continue
            if max_shards is not None and len(self._shards) >= max_shards:
                break
            arrays = {
                key: np.load(folder / f"{key}.npy", mmap_mode="r")
                for key in ("ids", "labels", "context", "offsets", "starts")
            }
            index = len(self._shards)
            self._shards.append(arrays)
            offsets, starts = np.asarray(arrays["offsets"]), np.asarray(arrays["starts"])
            kind = self.meta["shards"][name].get("kind", "response")
            self.sequences.extend(
                CachedSequence(index, int(offsets[i]), int(offsets[i + 1] - offsets[i]), int(starts[i]), kind)
                for i in range(len(starts))
            )
        if not self.sequences:
            raise ValueError(f"{self.cache_dir} holds no finished shard yet: run `adaflash cache-features` first.")

    def __len__(self) -> int:
        return len(self.sequences)

    @property
    def num_tokens(self) -> int:
        return sum(s.length for s in self.sequences)

    @property
    def num_response_tokens(self) -> int:
        """Tokens of the self-generated responses (their prompts and the corpus windows not counted)."""
        return sum(s.length - s.start for s in self.sequences if s.kind == "response")

    def indices(self, kind: str) -> list[int]:
        """Indices of the cached sequences of one kind: ``"response"`` (self-generated) or ``"corpus"``."""
        return [i for i, s in enumerate(self.sequences) if s.kind == kind]

    def tokens_of(self, kind: str) -> int:
        return sum(s.length for s in self.sequences if s.kind == kind)

    @property
    def size_bytes(self) -> int:
        return sum(f.stat().st_size for name in self.meta["shards"] for f in (self.cache_dir / name).glob("*.npy"))

    def check(self, target_name: str | None, layer_ids: list[int]) -> None:
        """Raise if the cache was computed for another target or other context layers than a drafter reads."""
        if list(layer_ids) != self.layer_ids:
            raise ValueError(
                f"the feature cache {self.cache_dir} holds target layers {self.layer_ids}, but the drafter "
                f"reads {list(layer_ids)}: pass --target-layer-ids {' '.join(map(str, self.layer_ids))}, "
                "or build a cache for those layers with `adaflash cache-features --target-layer-ids ...`."
            )
        if target_name is not None and self.meta["target"] != target_name:
            raise ValueError(
                f"the feature cache {self.cache_dir} was computed with target {self.meta['target']!r}, "
                f"not {target_name!r}: build one for this target with `adaflash cache-features`."
            )

    def training_sequence(self, index: int) -> TrainingSequence:
        s = self.sequences[index]
        ids = self._shards[s.shard]["ids"][s.offset : s.offset + s.length]
        return TrainingSequence(torch.from_numpy(np.array(ids, dtype=np.int64)), s.start)

    def batch(self, indices: list[int], pad_token_id: int) -> tuple[Batch, TargetFeatures]:
        """Right-padded batch and its cached features (context bf16 (b, L, n*H), labels (b, L); no logits)."""
        picked = [self.sequences[i] for i in indices]
        width = max(s.length for s in picked)
        width_ctx = self._shards[picked[0].shard]["context"].shape[1]
        input_ids = torch.full((len(picked), width), pad_token_id, dtype=torch.long)
        attention_mask = torch.zeros(len(picked), width, dtype=torch.long)
        label_mask = torch.zeros(len(picked), width, dtype=torch.bool)
        labels = torch.full((len(picked), width), IGNORE_INDEX, dtype=torch.long)
        context = torch.zeros(len(picked), width, width_ctx, dtype=torch.bfloat16)
        for row, s in enumerate(picked):
            arrays, span = self._shards[s.shard], slice(s.offset, s.offset + s.length)
            input_ids[row, : s.length] = torch.from_numpy(np.array(arrays["ids"][span], dtype=np.int64))
            labels[row, : s.length] = torch.from_numpy(np.array(arrays["labels"][span], dtype=np.int64))
            context[row, : s.length] = torch.from_numpy(np.array(arrays["context"][span])).view(torch.bfloat16)
            attention_mask[row, : s.length] = 1
            label_mask[row, max(s.start, 1) : s.length] = True
        return Batch(input_ids, attention_mask, label_mask), TargetFeatures(context, labels, None)


def cache_features(config) -> int:
    """``adaflash cache-features``: build or resume the cache, then print where it is and how big."""
    from ..configuration_adaflash import default_target_layer_ids
    from ..targets import load_target
    from .configs import CONTEXT_LAYERS

    if config.num_threads is not None:
        torch.set_num_threads(config.num_threads)
    target, tokenizer = load_target(config.target, dtype=config.target_dtype)
    num_layers = target.config.get_text_config().num_hidden_layers
    layer_ids = list(config.target_layer_ids or default_target_layer_ids(num_layers, CONTEXT_LAYERS))
    if not all(0 <= i < num_layers for i in layer_ids):
        raise ValueError(f"target_layer_ids {layer_ids}: the target has layers 0..{num_layers - 1}.")
    cache_dir = Path(config.cache_dir) if config.cache_dir else default_cache_dir(config.target, layer_ids)
    build_feature_cache(
        target,
        tokenizer,
        config.data_dir,
        cache_dir,
        layer_ids,
        config.target,
        batch_size=config.batch_size,
        max_minutes=config.max_minutes,
        corpus_domains=config.corpus,
        seq_len=config.seq_len,
        seed=config.seed,
    )
    store = FeatureStore(cache_dir)
    corpus = store.tokens_of("corpus")
    print(
        f"{len(store)} sequences, {store.num_tokens:,} tokens ({store.num_response_tokens:,} response tokens"
        + (f", {corpus:,} corpus tokens" if corpus else "")
        + f"), {store.size_bytes / 2**30:.2f} GiB in {cache_dir}"
    )
    return 0
