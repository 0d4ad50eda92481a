"""Where draft tokens come from, and the per-row choice between sources.

Verification does not care where a candidate continuation came from, so each round every row
merges its candidates into a draft tree (:mod:`.tree`; or, with ``tree_nodes=0`` and behind
``generate(assistant_model=)``, takes the most promising one) from:
- ``drafter``: the learned block-diffusion drafter's block (its logits over the draft vocabulary);
- ``suffix``: the most frequent continuation of the row's own latest n-gram in its prompt and output
  so far (SuffixDecoding / prompt lookup, with counts);
- ``global``: the same over a bounded index of earlier requests of this process, so structure that
  repeats across requests is reused;
- ``datastore``: the same over the target's own responses to training prompts, shipped with the
  drafter (``datastore.safetensors``, a REST-style datastore; see :func:`load_datastore`);
- nothing: a plain step, when no candidate is expected to pay for a longer verification.

"Most promising" is measured, not assumed: :class:`AcceptanceEstimator` keeps bounded counters of how
often a draft token was accepted given cheap features of the proposal (the n-gram length and counts
behind a suffix token; the drafter's position and top-1 probability), and the expected accepted
length of a candidate is the sum of the running products of those rates (DESIGN §2). How many
tokens to verify is the verify-length policy's decision (:mod:`.policy`).
"""

from __future__ import annotations

import json
import weakref
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F

from ..kernels import PackedLinear, can_pack, pack_weight, packed_linear, use_packed
from .cost import VerifyCostModel, interpolate, keep_monotone
from .policy import GoodputVerifyLength
from .tree import build_tree, chain_rates

SOURCES = ("drafter", "suffix", "global", "datastore")
DATASTORE_FILE = "datastore.safetensors"
PRIOR_FILE = "acceptance_prior.json"  # acceptance counts learned offline, shipped beside a drafter (prepare-drafter)
PRIOR_FORMAT = "adaflash-acceptance-prior"
NONE = "none"
TREE = "tree"  # the source of a proposal whose tree merges candidates of several sources


@dataclass
class DraftingConfig:
    """Which draft sources the engine may use each round, and how far suffix matches reach."""

    drafter: bool = field(default=True, metadata={"help": "Use the learned drafter's block (needs a drafter)."})
    suffix: bool = field(default=True, metadata={"help": "Use continuations of the row's own prompt and output (suffix match)."})
    global_index: bool = field(default=True, metadata={"help": "Use continuations from earlier requests of this process."})
    datastore: bool = field(default=True, metadata={"help": "Use continuations from the drafter's datastore of the target's own outputs, when it ships one."})
    max_ngram: int = field(default=4, metadata={"help": "Longest n-gram matched against the history (backs off to 1)."})
    max_suffix_tokens: int = field(default=16, metadata={"help": "Longest continuation a suffix match proposes."})
    global_max_tokens: int = field(default=262_144, metadata={"help": "Tokens the global index keeps (oldest requests are evicted first)."})
    tree_nodes: int = field(default=16, metadata={"help": "Most draft tokens a row verifies per round as a tree that merges its candidates (the batched engine); 0 verifies the single best candidate."})
    branches: int = field(default=3, metadata={"help": "Continuations each suffix index offers to the tree: the most frequent, then the runner-up next tokens."})
    drafter_scores: bool = field(default=True, metadata={"help": "Where a drafter pass is cheap (at most a tenth of a plain step, measured), run it every round and add its probability of each look-up token to that token's acceptance feature, so the tree spends its nodes on candidates the drafter also finds likely."})
    drafter_every_round: bool = field(default=False, metadata={"help": "Run the drafter every round, also where its recent acceptance says it would not pay (the engine otherwise skips it then, trying it every few rounds): how a drafter's own tau is measured."})

    def __post_init__(self) -> None:
        if self.max_ngram < 1 or self.max_suffix_tokens < 1 or self.global_max_tokens < 1:
            raise ValueError(
                f"max_ngram ({self.max_ngram}), max_suffix_tokens ({self.max_suffix_tokens}) and global_max_tokens "
                f"({self.global_max_tokens}) must all be >= 1."
            )
        if self.tree_nodes < 0 or self.branches < 1:
            raise ValueError(f"tree_nodes ({self.tree_nodes}) must be >= 0 and branches ({self.branches}) >= 1.")
        if not (self.drafter or self.suffix or self.global_index or self.datastore):
            raise ValueError("DraftingConfig switches every source off; enable at least one of drafter, suffix, global_index, datastore.")

    @classmethod
    def from_sources(cls, sources: str, tree_nodes: int | None = None) -> DraftingConfig:
        """A config from a comma-separated subset of ``drafter,suffix,global,datastore`` (the CLI's ``--sources``)
        and, unless None, a draft-tree size (``--tree-nodes``)."""
        chosen = {s.strip() for s in sources.split(",") if s.strip()}
        if not chosen or chosen - set(SOURCES):
            raise ValueError(f"--sources {sources!r}: choose one or more of {', '.join(SOURCES)}.")
        if tree_nodes is not None and tree_nodes < 0:
            raise ValueError(f"--tree-nodes {tree_nodes}: must be >= 0 (0 verifies one candidate per round).")
        tree = {} if tree_nodes is None else {"tree_nodes": tree_nodes}
        return cls(drafter="drafter" in chosen, suffix="suffix" in chosen, global_index="global" in chosen,
                   datastore="datastore" in chosen, **tree)

    @classmethod
    def only(cls, source: str) -> DraftingConfig:
        """A config with one source switched on (``drafter``, ``suffix``, ``global`` or ``datastore``)."""
        if source not in SOURCES:
            raise ValueError(f"unknown draft source {source!r}; choose from {', '.join(SOURCES)}.")
        return cls(drafter=source == "drafter", suffix=source == "suffix", global_index=source == "global",
                   datastore=source == "datastore")


def ngram_feature(position: int, n: int, count: int, total: int) -> tuple[int, int, int, bool]:
    """A look-up token's acceptance feature: (position capped at 2, n-gram length, count capped at 3, unanimous)."""
    return (min(position, 2), n, min(count, 3), count == total)


class NGramIndex:
    """Counts of the token that follows every n-gram (n = 1..max_n) of the token streams added.

    ``propose`` walks the most frequent continuation of the longest matching n-gram (backing off to
    shorter ones), SuffixDecoding-style. Each proposed token carries the feature ``(position, n,
    count, unanimous)`` (position capped at 2, count at 3) that :class:`AcceptanceEstimator` learns
    acceptance rates for: deeper tokens of a proposal are accepted less often at the same n-gram. With ``max_tokens``, the oldest
    streams are evicted once more tokens than that are indexed.
    """

    def __init__(self, max_n: int = 4, max_tokens: int | None = None):
        self.max_n = max_n
        self.max_tokens = max_tokens
        self.num_tokens = 0
        self._next: dict[tuple[int, ...], dict[int, int]] = {}  # n-gram -> {next token: count}
        self._streams: deque[list[int]] = deque()
        self._tail: list[int] = []  # the newest stream's last max_n tokens: context of the next extend()
        self.source_path: str | None = None  # the datastore file it was loaded from, if any

    def start_stream(self, tokens: Sequence[int] = ()) -> None:
        """Begin a new token stream (n-grams never span two streams)."""
        self._tail = []
        self._streams.append([])
        self.extend(tokens)

    def extend(self, tokens: Sequence[int]) -> None:
        """Append tokens to the newest stream, counting each after its preceding 1..max_n tokens."""
        if not self._streams:
            self._streams.append([])
        stream, tail = self._streams[-1], self._tail
        for token in tokens:
            for n in range(1, min(self.max_n, len(tail)) + 1):
                counts = self._next.setdefault(tuple(tail[-n:]), {})
                counts[token] = counts.get(token, 0) + 1
            tail.append(token)
            if len(tail) > self.max_n:
                del tail[0]
        if self.max_tokens is not None:
            stream.extend(tokens)
        self.num_tokens += len(tokens)
        while self.max_tokens is not None and self.num_tokens > self.max_tokens and len(self._streams) > 1:
            self._evict(self._streams.popleft())

    def _evict(self, stream: list[int]) -> None:
        for i, token in enumerate(stream):
            for n in range(1, min(self.max_n, i) + 1):
                key = tuple(stream[i - n : i])
                counts = self._next[key]
                counts[token] -= 1
                if not counts[token]:
                    del counts[token]
                    if not counts:
                        del self._next[key]
        self.num_tokens -= len(stream)

    def propose(self, context: Sequence[int], max_len: int) -> tuple[list[int], list[tuple[int, int, int, bool]]]:
        """The most frequent continuation of ``context`` (up to ``max_len`` tokens) and each token's feature."""
        return self.propose_branches(context, max_len, 1)[0]

    def propose_branches(self, context: Sequence[int], max_len: int, branches: int) -> list[tuple[list[int], list[tuple]]]:
        """Up to ``branches`` continuations of ``context``: the most frequent one first, then ones that start
        with the runner-up next tokens of the longest matching n-gram and go on with the most frequent."""
        window = list(context[-self.max_n :])
        n, counts = self._longest_match(window)
        if counts is None or max_len < 1:
            return [([], [])]
        total = sum(counts.values())
        firsts = sorted(counts.items(), key=lambda kv: -kv[1])[:branches]
        out = []
        for rank, (token, count) in enumerate(firsts):
            # a runner-up's first token carries its rank: it is accepted far less often than a top token of equal count
            tokens, features = [token], [ngram_feature(0, n, count, total) + ((rank,) if rank else ())]
            tail = window[1:] + [token] if len(window) >= self.max_n else window + [token]
            more, more_features = self._follow(tail, max_len - 1, start=1)
            out.append((tokens + more, features + more_features))
        return out

    def _longest_match(self, window: list[int]) -> tuple[int, dict[int, int] | None]:
        for n in range(min(self.max_n, len(window)), 0, -1):
            counts = self._next.get(tuple(window[-n:]))
            if counts:
                return n, counts
        return 0, None

    def _follow(self, window: list[int], max_len: int, start: int = 0) -> tuple[list[int], list[tuple]]:
        """The most frequent continuation from ``window``; features count positions from ``start``."""
        window = list(window[-self.max_n :])
        tokens: list[int] = []
        features: list[tuple[int, int, int, bool]] = []
        while len(tokens) < max_len:
            n, counts = self._longest_match(window)
            if counts is None:
                break
            token, count = max(counts.items(), key=lambda kv: kv[1])
            features.append(ngram_feature(start + len(tokens), n, count, sum(counts.values())))
            tokens.append(token)
            window.append(token)
            if len(window) > self.max_n:
                del window[0]
        return tokens, features


class AcceptanceEstimator:
    """P(draft token accepted | it was verified and every earlier draft was accepted), per feature.

    Bounded counters per ``(source, feature)``. A feature seen only a few times borrows the rate of
    its coarse class (``(source, position, rank)``: the feature's first entry and anything past its
    fourth, such as a runner-up branch's rank), with ``prior_weight`` pseudo-observations, and the
    class borrows the source's prior the same way; so a new, rare feature starts from what similar
    drafts got, not from a fixed guess (rare low-count n-grams and runner-up branches are accepted far
    less often than the source's average). Counts are halved once a key has seen ``max_count``
    drafts, so estimates track a drafter that changes (online adaptation) and memory stays flat in a
    long-running server.
    """

    PRIORS = {"drafter": 0.3, "suffix": 0.5, "global": 0.4, "datastore": 0.3}

    def __init__(self, prior_weight: float = 4.0, max_count: float = 4096.0):
        self.prior_weight, self.max_count = prior_weight, max_count
        self.hits: dict[tuple, float] = {}
        self.seen: dict[tuple, float] = {}

    @staticmethod
    def coarse(feature: tuple) -> tuple:
        return ("class", feature[0], *feature[4:])

    def _rate(self, key: tuple, prior: float) -> float:
        return (self.hits.get(key, 0.0) + self.prior_weight * prior) / (self.seen.get(key, 0.0) + self.prior_weight)

    def rate(self, source: str, feature: tuple) -> float:
        return self._rate((source, feature), self._rate((source, self.coarse(feature)), self.PRIORS[source]))

    def update(self, source: str, features: Sequence[tuple], num_verified: int, num_accepted: int) -> None:
        """Record one verified proposal: drafts 1..num_verified were checked, the first num_accepted passed."""
        for k, feature in enumerate(features[: min(num_verified, num_accepted + 1)]):
            for key in ((source, feature), (source, self.coarse(feature))):
                seen = self.seen.get(key, 0.0) + 1.0
                hits = self.hits.get(key, 0.0) + (k < num_accepted)
                if seen > self.max_count:
                    seen, hits = seen / 2, hits / 2
                self.seen[key], self.hits[key] = seen, hits

    def export(self) -> dict:
        """The counts as JSON-ready data: what :meth:`seed` reads (``acceptance_prior.json`` beside a drafter)."""
        entries = [[source, list(feature), round(self.hits.get((source, feature), 0.0), 3), round(seen, 3)]
                   for (source, feature), seen in self.seen.items()]
        return {"format": PRIOR_FORMAT, "version": 1, "entries": entries}

    def seed(self, prior: dict, cap: float = 16.0) -> None:
        """Add exported counts as a prior worth at most ``cap`` observations per feature, so the rates start
        where an offline run left them and live traffic takes over after a few dozen rounds."""
        for source, feature, hits, seen in prior["entries"]:
            key = (source, tuple(feature))
            scale = min(1.0, cap / seen) if seen > 0 else 0.0
            self.seen[key] = self.seen.get(key, 0.0) + seen * scale
            self.hits[key] = self.hits.get(key, 0.0) + hits * scale


def load_acceptance_prior(path: str | Path) -> dict:
    """Read an ``acceptance_prior.json``; a malformed one is an error that says how to rebuild or drop it."""
    try:
        prior = json.loads(Path(path).read_text())
        if not isinstance(prior, dict) or prior.get("format") != PRIOR_FORMAT:
            raise ValueError(f"its 'format' is not {PRIOR_FORMAT!r}")
        if not isinstance(prior.get("entries"), list):
            raise ValueError("it has no 'entries' list")
        for entry in prior["entries"]:
            source, feature, hits, seen = entry
            if source not in AcceptanceEstimator.PRIORS or not isinstance(feature, list) or not 0 <= hits <= seen:
                raise ValueError(f"entry {entry!r} is not [source, feature, hits <= seen]")
    except (OSError, ValueError, TypeError) as error:
        raise OSError(f"The acceptance prior {path} cannot be read ({error}): rebuild it with `adaflash prepare-drafter "
                      "--acceptance-prompts N`, or delete it (the engine then learns acceptance rates from scratch).") from error
    return prior


def expected_accepted(rates: Sequence[float]) -> float:
    """E[accepted drafts] of a candidate with conditional acceptance rates a_1..a_m: sum_k prod_{j<=k} a_j."""
    total, survive = 0.0, 1.0
    for a in rates:
        survive *= a
        total += survive
    return total


class DraftHead:
    """The target's lm_head restricted to the drafter's draft vocabulary (all rows when it has none).

    FR-Spec / EAGLE-3: most of the output mass sits on a small share of the vocabulary, and the lm_head
    is the drafter's main cost. Verification always uses the full vocabulary, so this stays lossless.
    The sliced weight is copied once per generation call (and packed for oneDNN where the target's own
    lm_head is, :mod:`adaflash_hf.kernels`).
    """

    def __init__(self, lm_head: torch.nn.Module, vocab: torch.Tensor | None):
        self.vocab = vocab
        self.weight = lm_head.weight if vocab is None else lm_head.weight.index_select(0, vocab.to(lm_head.weight.device))
        self.bias = None if getattr(lm_head, "bias", None) is None else (
            lm_head.bias if vocab is None else lm_head.bias.index_select(0, vocab.to(lm_head.bias.device)))
        self.packed = None
        if isinstance(lm_head, PackedLinear) and can_pack(self.weight):  # the full head is packed already: share it
            self.packed = lm_head._fresh_packed() if vocab is None else pack_weight(self.weight)
        vocab_size, device = lm_head.weight.shape[0], lm_head.weight.device
        draft_ids = torch.arange(vocab_size, device=device) if vocab is None else vocab.to(device)
        self._index = torch.full((vocab_size,), -1, dtype=torch.long, device=device).index_copy_(  # target id -> draft index
            0, draft_ids, torch.arange(draft_ids.numel(), device=device))

    def logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """(..., H) -> (..., V_draft) logits over the draft vocabulary."""
        # As a 2-D (rows, H) matmul: a sliced 3-D input such as hidden[:, 1:] keeps a non-standard stride
        # on its size-1 batch dim, which sends CPU bf16 matmuls down a path ~15x slower (measured).
        flat = hidden_states.reshape(-1, hidden_states.shape[-1])
        if self.packed is not None and use_packed(flat, self.weight):
            return packed_linear(flat, self.packed, self.bias).view(*hidden_states.shape[:-1], -1)
        return F.linear(flat, self.weight, self.bias).view(*hidden_states.shape[:-1], -1)

    def to_target_ids(self, draft_ids: torch.Tensor) -> torch.Tensor:
        return draft_ids if self.vocab is None else self.vocab.to(draft_ids.device)[draft_ids]

    def scorer(self, logits: torch.Tensor) -> Callable[[Sequence[tuple[int, Sequence[int]]]], list[list[float | None]]]:
        """From a block's draft logits (b, g, V_draft): ``score(queries)``, for each query ``(row, tokens)`` the
        drafter's probability of ``tokens[j]`` at block position j + 1 (0 outside the draft vocabulary, None
        past the block); one gather for all queries of a round."""
        width, normaliser = logits.shape[1], []  # log-normaliser (b, g), computed on the first call

        def score(queries: Sequence[tuple[int, Sequence[int]]]) -> list[list[float | None]]:
            rows, positions, ids, sizes = [], [], [], []
            for row, tokens in queries:
                j = min(len(tokens), width)
                rows += [row] * j
                positions += range(j)
                ids += tokens[:j]
                sizes.append((j, len(tokens)))
            flat: list[float] = []
            if ids:
                if not normaliser:
                    normaliser.append(torch.logsumexp(logits.float(), dim=-1))
                r, p = torch.tensor(rows, device=logits.device), torch.tensor(positions, device=logits.device)
                index = self._index[torch.tensor(ids, device=logits.device)]
                log_probs = logits[r, p, index.clamp_min(0)].float() - normaliser[0][r, p]
                flat = (log_probs.exp() * (index >= 0)).tolist()
            out, start = [], 0
            for j, n in sizes:
                out.append(flat[start : start + j] + [None] * (n - j))
                start += j
            return out

        return score

    def to_target_probs(self, probs: torch.Tensor, vocab_size: int) -> torch.Tensor:
        """(..., V_draft) probabilities -> (..., vocab_size), zero outside the draft vocabulary."""
        if self.vocab is None:
            return probs
        full = probs.new_zeros(*probs.shape[:-1], vocab_size)
        return full.index_copy_(-1, self.vocab.to(probs.device), probs)


def drafter_bucket(prob: float | None) -> str:
    """The drafter's opinion of a look-up candidate's token at its position, as a feature entry: ``"q0"``
    (under 1 %) .. ``"q3"`` (50 % or more), ``"q-"`` past the drafter's block (a string, so it never reads as
    a runner-up's rank)."""
    if prob is None:
        return "q-"
    return f"q{3 if prob >= 0.5 else 2 if prob >= 0.1 else 1 if prob >= 0.01 else 0}"


def drafter_feature(position: int, top_prob: float) -> tuple[int, int]:
    """Feature of a drafter token: its block position and its top-1 probability in fifths."""
    return position, min(int(top_prob * 5), 4)


@dataclass
class Proposal:
    """The chosen candidate of every row for one round.

    tokens (b, m) long, padded with 0 past each row's ``lengths``; rates (b, m) the estimated
    conditional acceptance of each token (0 past the end); sources the source per row ("none" when a
    row has no candidate, "tree" when its tree merges several sources); features per row, for the
    estimator's update after verification.

    A tree proposal (:mod:`.tree`) also has parents (b, m), each node's parent slot (0: the anchor, j + 1:
    node j), depths (b, m), 1 for a child of the anchor, and node_sources, the source of each node; its rates are :func:`~.tree.chain_rates` of the
    nodes' reach probabilities, so a verify length truncates the tree as it truncates a chain.
    """

    tokens: torch.Tensor
    rates: torch.Tensor
    lengths: torch.Tensor
    sources: list[str]
    features: list[list[tuple]]
    parents: torch.Tensor | None = None
    depths: torch.Tensor | None = None
    node_sources: list[list[str]] | None = None


class DraftingState:
    """What drafting learns across requests of one process: acceptance rates and the global index.

    Pass one instance to several ``generate`` calls (the default is one per target model, see
    :func:`default_drafting_state`); use separate instances to keep runs independent (e.g. in a benchmark).
    """

    EXPLORE_EVERY = 8  # rounds after which the drafter runs even when it does not seem to pay
    SCORE_COST = 0.1  # a drafter pass at most this share of a plain step runs every round to score look-ups

    def __init__(self, config: DraftingConfig | None = None):
        self.config = config or DraftingConfig()
        self.estimator = AcceptanceEstimator()
        self.forget_requests()  # the global index starts empty
        self.cost_model = VerifyCostModel()  # seconds per target forward by new tokens, measured as rounds run
        self.policy = GoodputVerifyLength(cost_model=self.cost_model)
        self.drafter_value: float | None = None  # moving average of drafts a drafter block got accepted
        self.drafter_seconds: dict[int, float] = {}  # rows -> moving average of one drafter pass over that many rows
        self.rounds_since_drafter = 0
        self.seeded = False  # whether a drafter's acceptance prior was added (once per state)

    def seed_acceptance(self, prior: dict | None) -> None:
        """Start the acceptance rates from a drafter's shipped prior (once; a state already seeded keeps its rates)."""
        if prior is not None and not self.seeded:
            self.estimator.seed(prior)
            self.seeded = True

    def observe_round(self, num_tokens: int, verify_seconds: float, drafter_seconds: float | None, rows: int = 1,
                      ragged: bool = False) -> None:
        """Feed one round's measured costs: the verification forward (``rows`` rows, ``num_tokens`` in all,
        ``ragged`` when rows of different lengths were packed) and, if it ran, the drafter."""
        self.cost_model.update(num_tokens, verify_seconds, rows, ragged=ragged)
        if drafter_seconds is not None:
            self.rounds_since_drafter = 0
            old = self.drafter_seconds.get(rows)
            self.drafter_seconds[rows] = drafter_seconds if old is None else 0.8 * old + 0.2 * drafter_seconds
            keep_monotone(self.drafter_seconds, rows)

    def drafter_cost(self, rows: int) -> float | None:
        """Estimated seconds of one drafter pass over ``rows`` rows: measured where that many rows drafted,
        else interpolated between (or extrapolated from) the row counts measured; None before any pass.

        A pass over 16 rows drafts 16 blocks and costs several times a one-row pass, so one average over the
        batch sizes a server runs would call the drafter cheap at high load and dear at batch 1."""
        return interpolate(self.drafter_seconds, rows) if self.drafter_seconds else None

    def drafter_pays(self, best_other: Sequence[float], width: int) -> bool:
        """Whether running the drafter this round is expected to pay for itself.

        The drafter can add ``max(0, D - E_row)`` accepted tokens per row, where D is what its blocks
        have recently been getting accepted and E_row the best other candidate; it pays when that
        relative gain in tokens beats its relative cost against a verification forward of ``width`` tokens per
        row for every row (both measured on this machine).
        """
        self.rounds_since_drafter += 1
        seconds = self.drafter_cost(len(best_other))
        if self.drafter_value is None or seconds is None or not self.cost_model.measured:
            return True  # nothing measured yet: try it
        if self.rounds_since_drafter >= self.EXPLORE_EVERY:
            return True  # keep its estimate fresh even while skipped (a drafter that adapts online improves)
        gain = sum(max(0.0, self.drafter_value - e) for e in best_other)
        tokens = sum(1 + e for e in best_other)
        return gain / tokens > seconds / self.cost_model.cost_batch(len(best_other), width)

    def drafter_is_cheap(self, rows: int) -> bool:
        """Whether a drafter pass costs at most ``SCORE_COST`` of a plain step of ``rows`` rows (both measured),
        so running it every round to score the look-up candidates (``DraftingConfig.drafter_scores``) is worth it."""
        seconds = self.drafter_cost(rows)
        if seconds is None or not self.cost_model.measured:
            return False
        return seconds <= self.SCORE_COST * self.cost_model.cost_batch(rows, 1)

    def remember(self, tokens: Sequence[int]) -> None:
        """Add a finished request (prompt and output) to the global index."""
        self.global_index.start_stream(tokens)

    def forget_requests(self) -> None:
        """Empty the global index (earlier requests' text); measured costs and acceptance rates stay."""
        self.global_index = NGramIndex(self.config.max_ngram, max_tokens=self.config.global_max_tokens)


_DEFAULT_STATES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def default_drafting_state(target: torch.nn.Module) -> DraftingState:
    """The :class:`DraftingState` that generation calls on ``target`` share unless given their own."""
    if target not in _DEFAULT_STATES:
        _DEFAULT_STATES[target] = DraftingState()
    return _DEFAULT_STATES[target]


def load_datastore(path: str | Path, max_n: int = 4) -> NGramIndex:
    """An :class:`NGramIndex` over the token streams of a ``datastore.safetensors`` file (``tokens``, ``lengths``)."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        tensors = load_file(str(path))
        if {"tokens", "lengths"} - tensors.keys() or int(tensors["lengths"].sum()) != tensors["tokens"].numel():
            raise ValueError("it needs a flat 'tokens' tensor and the 'lengths' of its streams, summing to its size")
    except (SafetensorError, ValueError) as error:
        raise OSError(f"The datastore {path} cannot be read ({error}): download or build it again "
                      "(adaflash prepare-drafter), or delete it to draft without one.") from error
    index = NGramIndex(max_n)
    for stream in torch.split(tensors["tokens"].long(), tensors["lengths"].tolist()):
        index.start_stream(stream.tolist())
    index.source_path = str(path)  # where its streams can be read again (OPD's retention check)
    return index


def save_datastore(streams: Sequence[Sequence[int]], path: str | Path) -> None:
    from safetensors.torch import save_file

    save_file({"tokens": torch.tensor([t for s in streams for t in s], dtype=torch.int32),
               "lengths": torch.tensor([len(s) for s in streams], dtype=torch.int64)}, str(path))


class HybridProposer:
    """Builds each round's :class:`Proposal` from the drafter block and the suffix indices of the rows."""

    def __init__(self, state: DraftingState, config: DraftingConfig, block_size: int | None, datastore: NGramIndex | None = None):
        """block_size: the drafter's block (None: no drafter runs); datastore: the drafter's, if it ships one."""
        self.state, self.config = state, config
        self.datastore = datastore if config.datastore else None
        if block_size is None and not (config.suffix or config.global_index or self.datastore is not None):
            raise ValueError("no draft source is left: pass a drafter, or enable suffix, global_index or a datastore in DraftingConfig.")
        matches = config.suffix or config.global_index or self.datastore is not None
        self.max_len = max((block_size or 1) - 1, config.max_suffix_tokens if matches else 0)  # longest proposal
        indices = int(config.suffix) + int(config.global_index) + int(self.datastore is not None)
        # a tree needs two candidates to merge: a lone drafter block stays a chain
        self.trees = config.tree_nodes > 0 and indices * config.branches + int(block_size is not None) > 1
        self.rows: dict[int, NGramIndex] = {}  # per-request suffix index over prompt + output
        self.history: dict[int, list[int]] = {}
        self._options: dict[int, list[tuple[str, list[int], list[tuple]]]] = {}  # this round's candidates per row

    def add_row(self, row: int, tokens: Sequence[int]) -> None:
        self.history[row] = list(tokens)
        if self.config.suffix:
            index = NGramIndex(self.config.max_ngram)
            index.start_stream(tokens)
            self.rows[row] = index

    def extend_row(self, row: int, tokens: Sequence[int]) -> None:
        self.history[row].extend(tokens)
        if self.config.suffix:
            self.rows[row].extend(tokens)

    def finish_row(self, row: int) -> None:
        history = self.history.pop(row)
        if self.config.global_index:
            self.state.remember(history)
        self.rows.pop(row, None)

    def propose(self, row_ids: list[int], run_drafter: Callable[[], tuple[torch.Tensor, torch.Tensor, Callable]] | None,
                tree: bool = False, max_depths: Sequence[int] | None = None, max_len: int | None = None) -> Proposal:
        """Choose, per row, the candidate with the most expected accepted drafts, or (``tree``) merge them.

        ``run_drafter()`` drafts a block for every row and returns its target ids (b, B-1), top-1
        probabilities (b, B-1) and a :meth:`DraftHead.scorer` of its logits; None without a drafter. It
        is called when the drafter's expected extra accepted tokens pay for its measured cost
        (:meth:`DraftingState.drafter_pays`) or, with ``DraftingConfig.drafter_scores``, when its pass is
        cheap (:meth:`DraftingState.drafter_is_cheap`); then its probability of every look-up token joins
        that token's feature. Otherwise the round skips it and its context waits for the next round that
        runs it.

        With ``tree``, every candidate (each index also offers ``DraftingConfig.branches`` continuations)
        goes into one draft tree per row of at most ``DraftingConfig.tree_nodes`` nodes and
        ``max_depths[i]`` levels (:func:`~.tree.build_tree`), for an engine that verifies trees.

        ``max_len``: the most drafts a row can verify this round (:func:`~.policy.verify_limit`); look-ups
        follow their matches no further, and ``run_drafter`` is expected to return no more block positions.
        """
        limit = self.max_len if max_len is None else max(0, min(self.max_len, max_len))
        branches = self.config.branches if tree else 1
        options_per_row = []
        for row in row_ids:
            options = []
            history = self.history[row]
            indices = [("suffix", self.rows.get(row)),
                       ("global", self.state.global_index if self.config.global_index and self.state.global_index.num_tokens else None),
                       ("datastore", self.datastore)]
            for source, index in indices:
                if index is not None:
                    options.extend((source, *branch) for branch in index.propose_branches(history, min(self.config.max_suffix_tokens, limit), branches))
            options_per_row.append(options)
        if run_drafter is not None:
            best_other = [max((self._value(o, limit)[0] for o in options), default=0.0) for options in options_per_row]
            pays = self.config.drafter_every_round or self.state.drafter_pays(best_other, limit + 1)
            scores = self.config.drafter_scores and self.state.drafter_is_cheap(len(row_ids))
            if pays or scores:
                block_tokens, block_probs, score = run_drafter()
                block_tokens, block_probs = block_tokens[:, :limit].tolist(), block_probs[:, :limit].tolist()
                if scores:  # the drafter's opinion of every look-up token joins that token's feature
                    probs = iter(score([(i, tokens) for i, options in enumerate(options_per_row) for _, tokens, _ in options]))
                    for options in options_per_row:
                        options[:] = [(source, tokens, [f + (drafter_bucket(q),) for f, q in zip(features, next(probs))])
                                      for source, tokens, features in options]
                for i, options in enumerate(options_per_row):
                    features = [drafter_feature(k, p) for k, p in enumerate(block_probs[i])]
                    options.insert(0, ("drafter", block_tokens[i], features))
        self._options = dict(zip(row_ids, options_per_row))
        if tree:
            return self._tree_proposal(options_per_row, max_depths or [limit] * len(row_ids), limit)
        chosen: list[tuple[str, list[int], list[tuple], list[float]]] = []
        for options in options_per_row:
            best, best_value = (NONE, [], [], []), 0.0
            for option in options:
                value, rates = self._value(option, limit)
                if value > best_value:
                    source, tokens, features = option
                    best, best_value = (source, tokens[:limit], features[:limit], rates), value
            chosen.append(best)
        width = max((len(c[1]) for c in chosen), default=0)
        tokens = torch.zeros(len(row_ids), width, dtype=torch.long)
        rates = torch.zeros(len(row_ids), width)
        for i, (_, toks, _, row_rates) in enumerate(chosen):
            tokens[i, : len(toks)] = torch.tensor(toks, dtype=torch.long)
            rates[i, : len(row_rates)] = torch.tensor(row_rates)
        lengths = torch.tensor([len(c[1]) for c in chosen], dtype=torch.long)
        return Proposal(tokens, rates, lengths, [c[0] for c in chosen], [c[2] for c in chosen])

    def _tree_proposal(self, options_per_row, max_depths: Sequence[int], limit: int) -> Proposal:
        trees, node_sources = [], []
        for options, depth in zip(options_per_row, max_depths):
            candidates = [(option[1], self._value(option, limit)[1]) for option in options]
            row_tree = build_tree(candidates, self.config.tree_nodes, min(depth, limit))
            trees.append(row_tree)
            node_sources.append([options[o][0] for o in row_tree.origins])
        width = max((len(t) for t in trees), default=0)
        b = len(trees)
        tokens, parents, depths = (torch.zeros(b, width, dtype=torch.long) for _ in range(3))  # padding: children of the anchor
        depths[:] = 1
        rates = torch.zeros(b, width)
        for i, row_tree in enumerate(trees):
            n = len(row_tree)
            tokens[i, :n] = torch.tensor(row_tree.tokens, dtype=torch.long)
            parents[i, :n] = torch.tensor(row_tree.parents, dtype=torch.long)
            depths[i, :n] = torch.tensor(row_tree.depths, dtype=torch.long)
            rates[i, :n] = torch.tensor(chain_rates(row_tree.probs))
        lengths = torch.tensor([len(t) for t in trees], dtype=torch.long)
        sources = [NONE if not ns else ns[0] if len(set(ns)) == 1 else TREE for ns in node_sources]
        return Proposal(tokens, rates, lengths, sources, [[] for _ in trees], parents=parents, depths=depths,
                        node_sources=node_sources)

    def no_proposal(self, row_ids: list[int]) -> Proposal:
        """An empty proposal (every row takes a plain step), made without looking anything up."""
        self._options = {}
        b = len(row_ids)
        return Proposal(torch.zeros(b, 0, dtype=torch.long), torch.zeros(b, 0), torch.zeros(b, dtype=torch.long), [NONE] * b,
                        [[] for _ in row_ids])

    def _value(self, option: tuple[str, list[int], list[tuple]], limit: int) -> tuple[float, list[float]]:
        source, _, features = option
        rates = [self.state.estimator.rate(source, f) for f in features[:limit]]
        return expected_accepted(rates), rates

    def record(self, row_ids: Sequence[int], chunks: Sequence[Sequence[int]]) -> None:
        """Teach the estimator from what the target produced, for every candidate of the round.

        ``chunks[i]`` are the tokens row i gained (accepted drafts plus the target's own token), i.e.
        the target's continuation. A candidate token would have been accepted exactly when it equals
        that continuation, so the candidates that were not chosen are scored too (counterfactually):
        every source keeps learning even while another one wins.
        """
        for row, chunk in zip(row_ids, chunks):
            for source, tokens, features in self._options.get(row, ()):
                agree = 0
                while agree < min(len(tokens), len(chunk)) and tokens[agree] == chunk[agree]:
                    agree += 1
                self.state.estimator.update(source, features, min(len(tokens), len(chunk)), agree)
                if source == "drafter":
                    old = self.state.drafter_value
                    self.state.drafter_value = agree if old is None else old + 0.05 * (agree - old)


def top_probs_and_tokens(head: DraftHead, hidden_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Drafter hidden states (b, g, H) -> (target ids (b, g), top-1 probabilities (b, g), draft-vocab logits (b, g, V_d))."""
    logits = head.logits(hidden_states)
    top_logit, top_index = logits.max(-1)
    top_prob = torch.exp(top_logit.float() - torch.logsumexp(logits.float(), dim=-1))
    return head.to_target_ids(top_index), top_prob, logits

