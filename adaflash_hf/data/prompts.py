"""Prompt sets and plain-text corpora per domain, with fixed train/eval splits.

This module owns the prompt schema, the prompt formats and the train/eval split rule; reading the
raw corpora is :mod:`adaflash_hf.data.corpora`'s job.

Schema. :func:`load_prompts` returns a :class:`datasets.Dataset` with the columns of
:data:`PROMPT_FEATURES`: ``id`` (unique), ``domain``, ``source`` (the corpus), ``doc_id`` (the source
document, the unit of the split), ``prompt`` (one user-turn string) and ``turns`` (all user turns of
a multi-turn conversation; ``[prompt]`` for single-turn prompts). :func:`load_text_corpus` returns
raw text chunks (``text``, ``domain``, ``source``, ``doc_id``) for cheap teacher-forced training.

Domains (:data:`DOMAINS`) and prompt formats:

- ``code``: HumanEval in the DFlash benchmark format (:func:`humaneval_prompt`), plus training
  prompts made from standard-library functions and classes ("Complete this Python function: …",
  "Explain what this Python code does: …", …). Evaluation uses HumanEval only.
- ``math``: GSM8K test questions in the DFlash format (:func:`gsm8k_prompt`).
- ``chat``: MT-Bench; ``prompt`` is the first turn, ``turns`` holds both.
- ``news`` (Lee corpus), ``wiki`` (enwiki articles), ``fiction`` (Jane Austen, one document per
  chapter): 150–250-word excerpts cut at sentence ends (a document's last excerpt, or a short
  document, may have fewer words) inside an instruction ("Continue this passage: …", "Summarise
  this news article …", …), at most :data:`MAX_PROMPTS_PER_DOCUMENT` excerpts per document.

Split rule (fixed, deterministic, independent of the machine and of ``seed``):

1. A document belongs to the eval split when ``sha256(f"{source}/{doc_id}")``, read as a 64-bit
   fraction, is below :data:`EVAL_FRACTION` (0.2); see :func:`document_split`. Every prompt and
   text chunk of a document lands on the side of its document, so the same source text never
   contributes to both splits (splitting is by document, never by prompt).
2. The eval prompt set of a domain is the first :data:`EVAL_PROMPTS_PER_DOMAIN` (40) eval prompts,
   taken round-robin over eval documents (first excerpt of every eval document in hash order, then
   the second excerpts, …). Eval documents beyond that cap are unused reserve: never trained on.
   Only benchmark prompts are eval candidates in ``code`` (HumanEval, not the stdlib prompts).
3. Near-duplicates never straddle the split: a train prompt or chunk is dropped when its content
   also occurs in an eval-bucket document (prose: any normalised sentence of 10+ words of its
   document; code: the same function text, HumanEval prompt, GSM8K question or MT-Bench turn).
   The Lee corpus, Wikipedia and the standard library all contain such repeats.
4. ``seed`` shuffles the train split of each domain before ``limit_per_domain`` is applied; the
   eval split keeps its fixed order, so a smaller ``limit_per_domain`` gives a prefix of it.
5. The eval split has two halves, by document (:func:`eval_half`): ``tuning`` (about half its documents)
   is where serving constants are tuned, ``validation`` (the rest) is where claims about them are
   checked, so a claim never rests on the prompts its constants were chosen on.

Default training mix: :data:`DEFAULT_TRAIN_DOMAINS` (code, math, chat). The prose domains
(:data:`HELD_OUT_DOMAINS`: news, wiki, fiction) are kept out of it so that domain shift can be
measured on text the drafter has never been trained on.

User data: :mod:`adaflash_hf.data.user_prompts` reads prompt files and Hub datasets into the same schema;
excerpts are cut by :mod:`adaflash_hf.data.excerpts`.
"""

from __future__ import annotations

import hashlib
import logging
import random
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

from datasets import Dataset

from . import corpora
from .excerpts import SENTENCE_BREAK, split_passages, spread_evenly
from .user_prompts import PROMPT_FEATURES, TEXT_FEATURES

logger = logging.getLogger(__name__)

DOMAINS = ("code", "math", "chat", "news", "wiki", "fiction")
DEFAULT_TRAIN_DOMAINS = ("code", "math", "chat")
HELD_OUT_DOMAINS = ("news", "wiki", "fiction")
SPLITS = ("train", "eval")
EVAL_FRACTION = 0.2
EVAL_PROMPTS_PER_DOMAIN = 40

# Words per excerpt in prose prompts, and how many prompts one document may give at most.
PROMPT_EXCERPT_WORDS = (150, 250)
MAX_PROMPTS_PER_DOCUMENT = {"code": 12, "news": 2, "wiki": 12, "fiction": 4}
# Words per plain-text chunk in load_text_corpus.
DEFAULT_CHUNK_WORDS = 256
# Code shown whole inside a prompt has this many lines.
MIN_PROMPT_CODE_LINES, MAX_PROMPT_CODE_LINES = 5, 60

Split = Literal["train", "eval"]


# ---------------------------------------------------------------------------------------------
# Prompt formats
# ---------------------------------------------------------------------------------------------


def humaneval_prompt(problem_prompt: str) -> str:
    """DFlash benchmark format of a HumanEval problem."""
    return (
        "Write a solution to the following problem and make sure that it passes the tests:\n"
        f"```python\n{problem_prompt}\n```"
    )


def gsm8k_prompt(question: str) -> str:
    """DFlash benchmark format of a GSM8K question."""
    return f"{question}\nPlease reason step by step, and put your final answer within \\boxed{{}}."


_CODE_TEMPLATES = (
    "Explain what this Python code does:\n```python\n{code}\n```",
    "Write pytest unit tests for this Python {kind}:\n```python\n{code}\n```",
    "Review this Python code and suggest improvements:\n```python\n{code}\n```",
)
_COMPLETE_TEMPLATE = "Complete this Python {kind}:\n```python\n{header}```"
_TEXT_TEMPLATES = {
    "news": (
        "Continue this news article:\n\n{excerpt}",
        "Summarise this news article in a few sentences:\n\n{excerpt}",
        "List the key facts reported in this article:\n\n{excerpt}",
        "Write a headline for this news article:\n\n{excerpt}",
    ),
    "wiki": (
        'Continue this passage from the Wikipedia article "{title}":\n\n{excerpt}',
        'Summarise this passage from the Wikipedia article "{title}":\n\n{excerpt}',
        "Explain this passage in simple terms:\n\n{excerpt}",
        "Write three questions, with answers, that test understanding of this text:\n\n{excerpt}",
    ),
    "fiction": (
        "Continue this passage:\n\n{excerpt}",
        "Continue this passage from {book} by Jane Austen in the same style:\n\n{excerpt}",
        "Summarise what happens in this passage:\n\n{excerpt}",
        "Rewrite this passage in plain modern English:\n\n{excerpt}",
    ),
}


# ---------------------------------------------------------------------------------------------
# Split rule
# ---------------------------------------------------------------------------------------------


def _unit_hash(key: str) -> float:
    """A stable fraction in [0, 1) from the first 8 bytes of sha256(key)."""
    return int.from_bytes(hashlib.sha256(key.encode("utf-8")).digest()[:8], "big") / 2**64


def document_split(source: str, doc_id: str) -> Split:
    """Split of a source document: ``"eval"`` for about :data:`EVAL_FRACTION` of documents."""
    return "eval" if _unit_hash(f"{source}/{doc_id}") < EVAL_FRACTION else "train"


EVAL_HALVES = ("tuning", "validation")


def eval_half(source: str, doc_id: str) -> str:
    """Half of the eval split a document belongs to: ``"tuning"`` or ``"validation"`` (about half each, by a hash
    independent of :func:`document_split`'s), so constants tuned on one half are checked on the other."""
    return EVAL_HALVES[_unit_hash(f"eval-half/{source}/{doc_id}") >= 0.5]


@dataclass(frozen=True)
class _Item:
    """A prompt or a text chunk, with what the split rule needs."""

    id: str
    domain: str
    source: str
    doc_id: str
    text: str  # the prompt, or the chunk of text
    turns: tuple[str, ...]
    rank: int  # index among its document's items: eval order is round-robin over documents
    eval_candidate: bool  # False for training-only material (stdlib prompts)
    keys: frozenset[str]  # content fingerprints: a train item sharing one with an eval document is dropped

    @property
    def split(self) -> Split:
        return document_split(self.source, self.doc_id)


def _select(
    items: Sequence[_Item], split: Split, limit: int | None, seed: int, leak_keys: frozenset[str], eval_cap: int | None
) -> list[_Item]:
    """Apply the split rule (module docstring) to one domain's items."""
    if split == "train":
        chosen = [item for item in items if item.split == "train" and not item.keys & leak_keys]
        dropped = sum(item.split == "train" for item in items) - len(chosen)
        if dropped:
            logger.info("Dropped %d train items that repeat text of eval documents", dropped)
        random.Random(seed).shuffle(chosen)
    else:
        chosen = [item for item in items if item.eval_candidate and item.split == "eval"]
        chosen.sort(key=lambda item: (item.rank, _unit_hash(f"{item.source}/{item.doc_id}"), item.id))
        chosen = chosen[:eval_cap]
    return chosen if limit is None else chosen[:limit]


def _eval_keys(items: Iterable[_Item]) -> frozenset[str]:
    return frozenset().union(*(item.keys for item in items if item.split == "eval"))


def _normalise(text: str) -> str:
    return " ".join(text.lower().split())


def _sentence_keys(text: str, min_words: int = 10) -> frozenset[str]:
    """Normalised sentences of at least ``min_words`` words: near-duplicate documents share some."""
    return frozenset(
        _normalise(sentence)
        for paragraph in re.split(r"\n\s*\n", text)
        for sentence in SENTENCE_BREAK.split(paragraph)
        if len(sentence.split()) >= min_words
    )


def _pick(templates: Sequence[str], key: str) -> str:
    return templates[int(_unit_hash(key) * len(templates))]


# Readers are looked up at call time (tests replace them with synthetic corpora).
_PROSE_SOURCES: dict[str, tuple[str, Callable[[], list[corpora.TextDocument]]]] = {
    "news": ("lee", lambda: corpora.read_lee_news()),
    "wiki": ("enwiki", lambda: corpora.read_enwiki()),
    "fiction": ("janeausten", lambda: corpora.read_austen()),
}


# ---------------------------------------------------------------------------------------------
# Prompts per domain
# ---------------------------------------------------------------------------------------------


def _code_prompts() -> list[_Item]:
    items = []
    for p in corpora.read_humaneval():
        text = humaneval_prompt(p.prompt)
        keys = frozenset({_normalise(p.prompt)})
        items.append(_Item(f"humaneval/{p.doc_id}", "code", "humaneval", p.doc_id, text, (text,), 0, True, keys))
    by_file: dict[str, list[tuple[int, corpora.CodeChunk]]] = {}
    for index, chunk in enumerate(corpora.read_stdlib_code()):
        by_file.setdefault(chunk.doc_id, []).append((index, chunk))
    for doc_id, chunks in by_file.items():
        usable = []
        for index, chunk in chunks:
            item_id = f"cpython-stdlib/{doc_id}#{index}"
            templates = [_COMPLETE_TEMPLATE] if chunk.header else []
            if MIN_PROMPT_CODE_LINES <= chunk.code.count("\n") <= MAX_PROMPT_CODE_LINES:
                templates.extend(_CODE_TEMPLATES)
            if templates:
                text = _pick(templates, item_id).format(code=chunk.code.rstrip(), header=chunk.header, kind=chunk.kind)
                usable.append((item_id, text, frozenset({_normalise(chunk.code)})))
        for rank, (item_id, text, keys) in enumerate(spread_evenly(usable, MAX_PROMPTS_PER_DOCUMENT["code"])):
            items.append(_Item(item_id, "code", "cpython-stdlib", doc_id, text, (text,), rank, False, keys))
    return items


def _math_prompts() -> list[_Item]:
    return [
        _Item(
            f"gsm8k/{p.doc_id}",
            "math",
            "gsm8k",
            p.doc_id,
            gsm8k_prompt(p.question),
            (gsm8k_prompt(p.question),),
            0,
            True,
            frozenset({_normalise(p.question)}),
        )
        for p in corpora.read_gsm8k()
    ]


def _chat_prompts() -> list[_Item]:
    return [
        _Item(
            f"mt_bench/{q.doc_id}",
            "chat",
            "mt_bench",
            q.doc_id,
            q.turns[0],
            q.turns,
            0,
            True,
            frozenset(map(_normalise, q.turns)),
        )
        for q in corpora.read_mt_bench()
    ]


def _prose_prompts(domain: str) -> list[_Item]:
    source, read = _PROSE_SOURCES[domain]
    items = []
    for doc in read():
        keys = _sentence_keys(doc.text)
        book = doc.title.split(",")[0]
        excerpts = list(enumerate(split_passages(doc.text, *PROMPT_EXCERPT_WORDS)))
        for rank, (index, excerpt) in enumerate(spread_evenly(excerpts, MAX_PROMPTS_PER_DOCUMENT[domain])):
            item_id = f"{source}/{doc.doc_id}#{index}"
            text = _pick(_TEXT_TEMPLATES[domain], item_id).format(excerpt=excerpt, title=doc.title, book=book)
            items.append(_Item(item_id, domain, source, doc.doc_id, text, (text,), rank, True, keys))
    return items


def _prompt_items(domain: str) -> list[_Item]:
    if domain == "code":
        return _code_prompts()
    if domain == "math":
        return _math_prompts()
    if domain == "chat":
        return _chat_prompts()
    return _prose_prompts(domain)


def _resolve_domains(domains: str | Sequence[str]) -> list[str]:
    names = list(DOMAINS) if domains == "all" else [domains] if isinstance(domains, str) else list(domains)
    unknown = [d for d in names if d not in DOMAINS]
    if unknown or not names:
        raise ValueError(f"Unknown domain(s) {unknown or names!r}: choose from {DOMAINS} or 'all'.")
    return list(dict.fromkeys(names))


def _check_split_and_limit(split: str, limit_per_domain: int | None) -> None:
    if split not in SPLITS:
        raise ValueError(f"split must be 'train' or 'eval', got {split!r}.")
    if limit_per_domain is not None and (not isinstance(limit_per_domain, int) or limit_per_domain < 0):
        raise ValueError(f"limit_per_domain must be None or an int >= 0, got {limit_per_domain!r}.")


def load_prompts(
    domains: str | Sequence[str] = "all",
    split: Split = "train",
    limit_per_domain: int | None = None,
    seed: int = 0,
) -> Dataset:
    """Prompts of the given domains and split, in the schema of :data:`PROMPT_FEATURES`.

    Args:
        domains: ``"all"``, one domain name or a list of them (see :data:`DOMAINS`); pass
            :data:`DEFAULT_TRAIN_DOMAINS` for the default training mix.
        split: ``"train"`` or ``"eval"`` (rule in the module docstring).
        limit_per_domain: keep at most this many prompts per domain (``None``: all).
        seed: shuffles each domain's train prompts before the limit; the eval order is fixed.

    Rows are grouped by domain, in the order given. The first call per corpus downloads it (see
    :mod:`adaflash_hf.data.corpora`); later calls work offline.
    """
    _check_split_and_limit(split, limit_per_domain)
    rows = []
    for domain in _resolve_domains(domains):
        leak_keys = _eval_keys(_text_items(domain, DEFAULT_CHUNK_WORDS)) if split == "train" else frozenset()
        chosen = _select(_prompt_items(domain), split, limit_per_domain, seed, leak_keys, EVAL_PROMPTS_PER_DOMAIN)
        logger.info("%s/%s: %d prompts", domain, split, len(chosen))
        rows.extend(
            {
                "id": i.id,
                "domain": i.domain,
                "source": i.source,
                "doc_id": i.doc_id,
                "prompt": i.text,
                "turns": list(i.turns),
            }
            for i in chosen
        )
    return Dataset.from_list(rows, features=PROMPT_FEATURES)


# ---------------------------------------------------------------------------------------------
# Plain text for teacher-forced training
# ---------------------------------------------------------------------------------------------


def _strip_calculator(answer: str) -> str:
    """GSM8K answers annotate arithmetic as ``<<16-3-4=9>>``: drop the annotations."""
    return re.sub(r"<<[^>]*>>", "", answer)


def _text_items(domain: str, chunk_words: int) -> list[_Item]:
    """Every text chunk of a domain; together their keys cover all of the domain's content."""

    def item(source: str, doc_id: str, rank: int, text: str, keys: frozenset[str]) -> _Item:
        return _Item(f"{source}/{doc_id}#{rank}", domain, source, doc_id, text, (text,), rank, True, keys)

    if domain == "code":
        items = [
            item("humaneval", p.doc_id, 0, p.prompt + p.canonical_solution, frozenset({_normalise(p.prompt)}))
            for p in corpora.read_humaneval()
        ]
        rank: dict[str, int] = {}
        for c in corpora.read_stdlib_code():
            rank[c.doc_id] = rank.get(c.doc_id, -1) + 1
            items.append(item("cpython-stdlib", c.doc_id, rank[c.doc_id], c.code, frozenset({_normalise(c.code)})))
        return items
    if domain == "math":
        return [
            item(
                "gsm8k",
                p.doc_id,
                0,
                f"{p.question}\n\n{_strip_calculator(p.answer)}",
                frozenset({_normalise(p.question)}),
            )
            for p in corpora.read_gsm8k()
        ]
    if domain == "chat":
        return [
            item("mt_bench", q.doc_id, 0, "\n\n".join(q.turns), frozenset(map(_normalise, q.turns)))
            for q in corpora.read_mt_bench()
        ]
    source, read = _PROSE_SOURCES[domain]
    items = []
    for doc in read():
        keys = _sentence_keys(doc.text)
        for index, passage in enumerate(split_passages(doc.text, max(1, chunk_words // 2), chunk_words)):
            items.append(item(source, doc.doc_id, index, passage, keys))
    return items


def load_text_corpus(
    domains: str | Sequence[str] = "all",
    split: Split = "train",
    chunk_words: int = DEFAULT_CHUNK_WORDS,
    limit_per_domain: int | None = None,
    seed: int = 0,
) -> Dataset:
    """Raw text chunks (columns of :data:`TEXT_FEATURES`) under the same document-level split.

    Prose is cut into passages of ``chunk_words // 2`` to ``chunk_words`` words at sentence ends
    (see :func:`split_passages`); code chunks are whole stdlib functions/classes and HumanEval
    problems with their canonical solution; math chunks are GSM8K question + worked answer (without
    calculator annotations); chat chunks are the MT-Bench turns. A chunk is in ``split`` when its
    document is (:func:`document_split`), with the same duplicate filter as :func:`load_prompts`;
    the eval split has no cap here and is ordered round-robin over documents. ``seed`` shuffles the
    train chunks of each domain before ``limit_per_domain``.
    """
    _check_split_and_limit(split, limit_per_domain)
    if chunk_words < 2:
        raise ValueError(f"chunk_words must be >= 2, got {chunk_words}.")
    rows = []
    for domain in _resolve_domains(domains):
        items = _text_items(domain, chunk_words)
        leak_keys = _eval_keys(items) if split == "train" else frozenset()
        chosen = _select(items, split, limit_per_domain, seed, leak_keys, eval_cap=None)
        logger.info("%s/%s: %d text chunks", domain, split, len(chosen))
        rows.extend({"text": i.text, "domain": i.domain, "source": i.source, "doc_id": i.doc_id} for i in chosen)
    return Dataset.from_list(rows, features=TEXT_FEATURES)
