"""Trajectories of the target, recorded from live decoding, and the bounded buffer they wait in.

A :class:`Trajectory` is one request as the target decoded it: its tokens, the target's context
features at every processed position (what the drafter reads), the target's distribution behind
every generated token compressed to its top-k (what OPD distils), and where verification rejected a
drafter's draft (where OPD weights the loss up, after Draft-OPD). :class:`TrajectoryRecorder`
assembles them from the engine's round callbacks (:class:`~adaflash_hf.decoding.recording.RoundObserver`)
at no extra target cost, and :class:`TrajectoryBuffer` holds them for the trainer: bounded in count
and bytes (the oldest go first), thread-safe, with counters for what was dropped.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field

import torch

from ..data.excerpts import spread_evenly
from ..drafters import load_retention_samples


@dataclass
class Trajectory:
    """One decoded sequence.

    tokens (T,): prompt then generated tokens; ``prompt_len`` P. features (T - 1, F): target context
    features after tokens 0..T-2 (the last token was never fed back). teacher_ids / teacher_logprobs
    (T - P, k): the target's top-k next-token ids and log-probabilities at positions P-1..T-2, i.e.
    behind tokens P..T-1. rejected (T,) bool: token t is where verification rejected a drafter draft.
    source_tokens: how many generated tokens each draft source produced (statistics).
    """

    tokens: torch.Tensor
    prompt_len: int
    features: torch.Tensor
    teacher_ids: torch.Tensor
    teacher_logprobs: torch.Tensor
    rejected: torch.Tensor
    tag: str = ""
    source_tokens: dict[str, int] = field(default_factory=dict)

    @property
    def num_generated(self) -> int:
        return len(self.tokens) - self.prompt_len

    @property
    def nbytes(self) -> int:
        return sum(
            t.numel() * t.element_size()
            for t in (self.tokens, self.features, self.teacher_ids, self.teacher_logprobs, self.rejected)
        )


class TrajectoryBuffer:
    """A bounded, thread-safe FIFO of trajectories: the engine adds, the trainer takes.

    Full (``max_trajectories`` or ``max_bytes``): the oldest are dropped, never the newest, and the
    engine never waits. Counters: ``added``, ``dropped``, ``taken``.
    """

    def __init__(self, max_trajectories: int = 512, max_bytes: int = 512 * 2**20):
        if max_trajectories < 1 or max_bytes < 1:
            raise ValueError(f"a buffer needs room: max_trajectories={max_trajectories}, max_bytes={max_bytes}.")
        self.max_trajectories, self.max_bytes = max_trajectories, max_bytes
        self._items: deque[Trajectory] = deque()
        self._bytes = 0
        self._lock = threading.Lock()
        self._ready = threading.Condition(self._lock)
        self.added = self.dropped = self.taken = 0

    def add(self, trajectory: Trajectory) -> None:
        with self._lock:
            self._items.append(trajectory)
            self._bytes += trajectory.nbytes
            self.added += 1
            while len(self._items) > self.max_trajectories or (self._bytes > self.max_bytes and len(self._items) > 1):
                self._bytes -= self._items.popleft().nbytes
                self.dropped += 1
            self._ready.notify_all()

    def take(self, n: int, timeout: float | None = None) -> list[Trajectory]:
        """Remove and return up to ``n`` of the oldest trajectories, waiting up to ``timeout`` s for one."""
        with self._ready:
            if not self._items and timeout:
                self._ready.wait(timeout)
            out = [self._items.popleft() for _ in range(min(n, len(self._items)))]
            self._bytes -= sum(t.nbytes for t in out)
            self.taken += len(out)
            return out

    def __len__(self) -> int:
        with self._lock:
            return len(self._items)

    @property
    def nbytes(self) -> int:
        with self._lock:
            return self._bytes

    def counters(self) -> dict[str, int]:
        with self._lock:
            return {
                "size": len(self._items),
                "bytes": self._bytes,
                "added": self.added,
                "dropped": self.dropped,
                "taken": self.taken,
            }


@dataclass
class _Open:
    """A row being recorded: chunks appended round by round, concatenated when it finishes."""

    tokens: list[int]
    prompt_len: int
    features: list[torch.Tensor]
    teacher_ids: list[torch.Tensor]
    teacher_logprobs: list[torch.Tensor]
    rejected: list[int]
    tag: str
    source_tokens: dict[str, int]


class TrajectoryRecorder:
    """Builds :class:`Trajectory` objects from the engine's round callbacks into a buffer.

    top_k: teacher entries kept per generated token. min_generated: shorter trajectories are not kept.
    ``tag_for(row_id)`` may label a trajectory (e.g. with its domain); the default is "".
    Copies what it keeps (features as bf16), so it never holds the engine's tensors.
    """

    def __init__(self, buffer: TrajectoryBuffer, top_k: int = 32, min_generated: int = 2, tag_for=None):
        if top_k < 1:
            raise ValueError(f"top_k must be >= 1, got {top_k}.")
        self.buffer, self.top_k, self.min_generated = buffer, top_k, min_generated
        self.tag_for = tag_for
        self._open: dict[Hashable, _Open] = {}
        self._lock = threading.Lock()

    def _teacher(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(n, V) logits -> top-k ids (n, k) int32 and their log-probabilities (n, k) float32."""
        logprobs = torch.log_softmax(logits.float(), dim=-1)
        values, ids = logprobs.topk(min(self.top_k, logprobs.shape[-1]), dim=-1)
        return ids.int(), values

    def before_round(self) -> None:
        pass

    def on_prefill(self, row_id: Hashable, prompt_ids: Sequence[int], features, logits, first_token: int) -> None:
        if features is None:
            return
        ids, logprobs = self._teacher(logits[None])
        tag = self.tag_for(row_id) if self.tag_for is not None else ""
        with self._lock:
            self._open[row_id] = _Open(
                list(prompt_ids) + [first_token],
                len(prompt_ids),
                [features.to(torch.bfloat16, copy=True)],
                [ids],
                [logprobs],
                [],
                tag,
                {"target": 1},
            )

    def on_round(self, row_id: Hashable, features, logits, tokens: Sequence[int], num_drafts: int, source: str) -> None:
        with self._lock:
            row = self._open.get(row_id)
        if row is None or features is None or not tokens:
            return
        n = len(tokens)
        ids, logprobs = self._teacher(logits[:n])
        if num_drafts > n - 1 and source == "drafter":  # draft n was rejected: token n-1 of this chunk replaced it
            row.rejected.append(len(row.tokens) + n - 1)
        row.tokens.extend(tokens)
        row.features.append(features[:n].to(torch.bfloat16, copy=True))
        row.teacher_ids.append(ids)
        row.teacher_logprobs.append(logprobs)
        row.source_tokens[source] = row.source_tokens.get(source, 0) + n - 1
        row.source_tokens["target"] += 1

    def on_finish(self, row_id: Hashable) -> None:
        with self._lock:
            row = self._open.pop(row_id, None)
        if row is None or len(row.tokens) - row.prompt_len < self.min_generated:
            return
        tokens = torch.tensor(row.tokens, dtype=torch.int32)
        rejected = torch.zeros(len(tokens), dtype=torch.bool)
        rejected[row.rejected] = True
        self.buffer.add(
            Trajectory(
                tokens,
                row.prompt_len,
                torch.cat(row.features),
                torch.cat(row.teacher_ids),
                torch.cat(row.teacher_logprobs),
                rejected,
                row.tag,
                row.source_tokens,
            )
        )

    @property
    def open_rows(self) -> int:
        with self._lock:
            return len(self._open)


@torch.no_grad()
def teacher_forced_trajectory(
    target, layer_ids: Sequence[int], tokens: Sequence[int], prompt_len: int = 1, top_k: int = 32, tag: str = ""
) -> Trajectory:
    """The trajectory the recorder would keep had the engine decoded ``tokens[prompt_len:]`` after
    ``tokens[:prompt_len]``, from one target forward over the whole sequence: for text the target
    produced before (a drafter's datastore of its greedy responses), no generation is needed.

    The teacher is the target's distribution at each position, so where the text departs from the
    target's greedy choice, training and the acceptance check follow the target, not the text.
    """
    from ..decoding.proposers.drafter import context_features

    if not 1 <= prompt_len < len(tokens):
        raise ValueError(f"prompt_len must be in [1, {len(tokens) - 1}] for {len(tokens)} tokens, got {prompt_len}.")
    device = next(target.parameters()).device
    ids = torch.as_tensor(list(tokens), dtype=torch.long, device=device)[None]
    out = target(input_ids=ids, output_hidden_states=True, use_cache=False)
    features = context_features(out.hidden_states, list(layer_ids))[0, :-1]  # after tokens 0..T-2
    logprobs = torch.log_softmax(out.logits[0, prompt_len - 1 : -1].float(), dim=-1)
    values, top = logprobs.topk(min(top_k, logprobs.shape[-1]), dim=-1)
    return Trajectory(
        ids[0].int().cpu(),
        prompt_len,
        features.to(torch.bfloat16).cpu(),
        top.int().cpu(),
        values.cpu(),
        torch.zeros(ids.shape[1], dtype=torch.bool),
        tag,
    )


def retention_samples(drafter, count: int, max_response_tokens: int = 128) -> list[tuple[list[int], int]]:
    """Up to ``count`` ``(tokens, prompt_len)`` samples of the drafter's training domains: its folder's
    ``retention.safetensors`` (prompts with the target's responses, cut to ``max_response_tokens``),
    else responses of its datastore with no prompt (a weaker proxy: the target reads them without the
    question they answer); [] when it ships neither."""
    path = getattr(drafter, "adaflash_retention_file", None)
    if path is not None and count > 0:
        samples = load_retention_samples(path)
        return [(tokens[: start + max_response_tokens], start) for tokens, start in spread_evenly(samples, count)]
    return [(tokens, 1) for tokens in datastore_sequences(drafter, count, max_response_tokens)]


def datastore_sequences(drafter, count: int, max_tokens: int = 128, min_tokens: int = 16) -> list[list[int]]:
    """Up to ``count`` token sequences of the drafter's datastore (the target's own responses to the
    drafter's training prompts), spread evenly over it and cut to ``max_tokens``; [] without one."""
    from safetensors.torch import load_file

    path = getattr(getattr(drafter, "adaflash_datastore", None), "source_path", None)
    if path is None or count < 1:
        return []
    tensors = load_file(str(path))
    streams = [s for s in torch.split(tensors["tokens"].long(), tensors["lengths"].tolist()) if len(s) >= min_tokens]
    return [s[:max_tokens].tolist() for s in spread_evenly(streams, count)]
