"""Tests for adaflash_hf.data: split rule, prompt formats, parsers and user prompt loaders.

The default tests use synthetic records and need no network. Tests that download the real corpora
are marked ``real_model`` (deselected by default; run them with ``-m real_model``).
"""

from __future__ import annotations

import gzip
import hashlib
import json
import lzma
import struct
import zlib
from collections import Counter
from pathlib import Path

import pytest
from datasets import Dataset, DatasetDict

from adaflash_hf.data import corpora, prompts, rdata
from adaflash_hf.data.excerpts import split_passages
from adaflash_hf.data.markup import split_chapters, wiki_to_text
from adaflash_hf.data.prompts import (
    DEFAULT_TRAIN_DOMAINS,
    DOMAINS,
    EVAL_FRACTION,
    EVAL_PROMPTS_PER_DOMAIN,
    HELD_OUT_DOMAINS,
    document_split,
    gsm8k_prompt,
    humaneval_prompt,
    load_prompts,
    load_text_corpus,
)
from adaflash_hf.data.user_prompts import PROMPT_FEATURES, TEXT_FEATURES, as_prompt_dataset, load_prompts_jsonl

# ---------------------------------------------------------------------------------------------
# Split rule
# ---------------------------------------------------------------------------------------------


def test_document_split_follows_documented_hash_rule() -> None:
    for source, doc_id in [("humaneval", "HumanEval/7"), ("lee", "lee/003"), ("enwiki", "303")]:
        digest = hashlib.sha256(f"{source}/{doc_id}".encode()).digest()
        expected = "eval" if int.from_bytes(digest[:8], "big") / 2**64 < EVAL_FRACTION else "train"
        assert document_split(source, doc_id) == expected


def test_document_split_is_pinned() -> None:
    # A change here silently moves benchmark problems into training: it must be deliberate.
    assert [document_split("humaneval", f"HumanEval/{i}") for i in range(5)] == ["train"] * 4 + ["eval"]
    assert [document_split("gsm8k", f"{i:04d}") for i in range(4)] == ["train", "train", "eval", "eval"]


def test_document_split_fraction() -> None:
    splits = Counter(document_split("synthetic", str(i)) for i in range(20_000))
    assert abs(splits["eval"] / 20_000 - EVAL_FRACTION) < 0.01


def _synthetic_items(n_docs: int = 400) -> list[prompts._Item]:
    rows = []
    for doc in range(n_docs):
        candidate = doc % 3 != 0  # a third of documents are training-only material
        for rank in range(doc % 5 + 1):
            text = f"doc {doc} prompt {rank}"
            keys = frozenset({f"doc {doc}"})
            rows.append(prompts._Item(f"s/{doc}#{rank}", "news", "s", str(doc), text, (text,), rank, candidate, keys))
    return rows


def _select(items: list[prompts._Item], split: str, limit: int | None = None, seed: int = 0) -> list[prompts._Item]:
    return prompts._select(items, split, limit, seed, prompts._eval_keys(items), EVAL_PROMPTS_PER_DOMAIN)


def test_select_splits_by_document() -> None:
    rows = _synthetic_items()
    train, evals = _select(rows, "train"), _select(rows, "eval")
    train_docs, eval_docs = {p.doc_id for p in train}, {p.doc_id for p in evals}
    assert not train_docs & eval_docs
    assert all(document_split("s", d) == "train" for d in train_docs)
    # Every prompt of a train document is in train; eval-bucket documents never reach train.
    assert len(train) == sum(document_split("s", p.doc_id) == "train" for p in rows)
    assert len(evals) == EVAL_PROMPTS_PER_DOMAIN
    assert all(p.eval_candidate for p in evals)


def test_select_drops_train_items_that_repeat_eval_content() -> None:
    rows = _synthetic_items(60)
    eval_doc = next(p for p in rows if p.split == "eval")
    train_doc = next(p for p in rows if p.split == "train")
    copy = prompts._Item("s/copy", "news", "s", train_doc.doc_id, "copy", ("copy",), 9, True, eval_doc.keys)
    train = _select([*rows, copy], "train")
    assert copy not in train and train_doc in train


def test_eval_selection_is_round_robin_and_fixed() -> None:
    rows = _synthetic_items()
    candidates = [p for p in rows if p.eval_candidate and p.split == "eval"]
    n_docs = len({p.doc_id for p in candidates})
    evals = _select(rows, "eval")
    ranks = [p.rank for p in evals]
    assert ranks == sorted(ranks)
    assert ranks.count(0) == min(n_docs, EVAL_PROMPTS_PER_DOMAIN)
    assert _select(rows[::-1], "eval", seed=5) == evals
    assert _select(rows, "eval", limit=7, seed=3) == evals[:7]


def test_train_selection_seed_shuffles_same_set() -> None:
    rows = _synthetic_items()
    a, b = _select(rows, "train", seed=0), _select(rows, "train", seed=1)
    assert a != b and sorted(p.id for p in a) == sorted(p.id for p in b)
    assert _select(rows, "train", seed=0) == a
    assert _select(rows, "train", limit=10, seed=0) == a[:10]


# ---------------------------------------------------------------------------------------------
# Prompt formats and excerpts
# ---------------------------------------------------------------------------------------------


def test_benchmark_prompt_formats() -> None:
    assert humaneval_prompt("def f():\n") == (
        "Write a solution to the following problem and make sure that it passes the tests:\n```python\ndef f():\n\n```"
    )
    assert gsm8k_prompt("What is 2+2?") == (
        "What is 2+2?\nPlease reason step by step, and put your final answer within \\boxed{}."
    )


def test_split_passages_respects_bounds_and_keeps_order() -> None:
    sentences = [f"Sentence number {i} has exactly seven words." for i in range(100)]
    text = "\n\n".join(" ".join(sentences[i : i + 5]) for i in range(0, 100, 5))
    passages = split_passages(text, 20, 40)
    assert all(20 <= len(p.split()) <= 40 for p in passages)
    kept, words = " ".join(passages).split(), text.split()
    assert kept == words[: len(kept)] and len(words) - len(kept) < 20 // 2  # in order; only a short tail dropped
    assert any("\n\n" in p for p in passages)  # paragraph breaks survive


def test_split_passages_cuts_long_sentences_and_drops_short_tail() -> None:
    assert [len(p.split()) for p in split_passages(" ".join(["word"] * 95), 20, 40)] == [40, 40, 15]
    assert [len(p.split()) for p in split_passages(" ".join(["word"] * 85), 20, 40)] == [40, 40]  # tail < 10
    assert split_passages("Only a short text.", 20, 40) == ["Only a short text."]
    with pytest.raises(ValueError, match="min_words"):
        split_passages("x", 50, 10)


# ---------------------------------------------------------------------------------------------
# Corpus parsers on synthetic inputs
# ---------------------------------------------------------------------------------------------


def test_wiki_to_text_strips_markup() -> None:
    markup = (
        "{{Infobox thing|name={{nested}}}}\n"
        "'''Aardvark''' is a [[mammal]] native to [[Africa|the African continent]].<ref>Cite</ref> "
        "It weighs <10 kg.<ref name=x/>\n"
        "[[File:Aardvark.jpg|thumb|An [[aardvark]] at night]]\n"
        "{| class=wikitable\n| cell\n|}\n"
        "== Habitat ==\n"
        "It lives in [http://example.org savannas] and &quot;grasslands&quot;.<!-- hidden -->\n"
        "* first item\n"
        "== References ==\n"
        "Never shown.\n"
        "[[Category:Mammals]]\n"
    )
    text = wiki_to_text(markup)
    assert text == (
        "Aardvark is a mammal native to the African continent. It weighs <10 kg.\n\n"
        "Habitat\n\n"
        'It lives in savannas and "grasslands".\n\n'
        "- first item"
    )


def test_split_chapters_drops_front_matter_and_joins_lines() -> None:
    lines = [
        "A NOVEL",
        "",
        "VOLUME I",
        "",
        "CHAPTER I",
        "",
        "It was a _fine_ day,",
        "said she.",
        "",
        "Second paragraph.",
        "",
        "Chapter 2",
        "",
        "More text.",
        "",
        "THE END",
        "",
        "Editorial note.",
    ]
    assert split_chapters(lines) == [
        "It was a fine day, said she.\n\nSecond paragraph.",
        "More text.",
    ]


def test_stdlib_chunks(tmp_path: Path) -> None:
    (tmp_path / "pkg" / "test").mkdir(parents=True)
    (tmp_path / "pkg" / "test" / "test_mod.py").write_text("def test_x():\n    a = 1\n    assert a\n")
    long_class = "class Big:\n" + "".join(
        f"    def m{i}(self):\n        x = {i}\n        return x\n\n" for i in range(25)
    )
    (tmp_path / "pkg" / "mod.py").write_text(
        "import os\n\n"
        "@decorator\n"
        "def add(a, b):\n"
        '    """Add two numbers."""\n'
        "    return a + b\n\n"
        "class Small:\n    x = 1\n    y = 2\n\n"
        "def tiny(): pass\n\n" + long_class
    )
    chunks = corpora.read_stdlib_code(root=tmp_path)
    assert {c.doc_id for c in chunks} == {"pkg/mod.py"}
    by_name = {c.name: c for c in chunks}
    assert by_name["add"].code.startswith("@decorator\ndef add")
    assert by_name["add"].header == '@decorator\ndef add(a, b):\n    """Add two numbers."""\n'
    assert by_name["Small"].kind == "class" and "tiny" not in by_name and "Big" not in by_name
    assert by_name["Big.m3"].kind == "method" and by_name["Big.m3"].code.startswith("def m3(self):")


def test_cached_records_build_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ADAFLASH_HOME", str(tmp_path))
    calls = []

    def build() -> list[corpora.ChatQuestion]:
        calls.append(1)
        return [corpora.ChatQuestion("1", "writing", ("Hi", "Again"))]

    first = corpora._cached_records("demo", corpora.ChatQuestion, build)
    second = corpora._cached_records("demo", corpora.ChatQuestion, build)
    assert first == second == [corpora.ChatQuestion("1", "writing", ("Hi", "Again"))]
    assert len(calls) == 1 and (tmp_path / "corpora" / f"demo.v{corpora.CACHE_FORMAT}.jsonl").exists()


# A minimal writer of R's XDR serialization, to test the reader without R.
def _i(v: int) -> bytes:
    return struct.pack(">i", v)


def _char(s: str | None, latin1: bool = False) -> bytes:
    if s is None:
        return _i(9) + _i(-1)
    data = s.encode("latin-1" if latin1 else "utf-8")
    return _i(9 | ((4 if latin1 else 8) << 12)) + _i(len(data)) + data


def _attrs(pairs: list[tuple[str, bytes]]) -> bytes:
    out = b""
    for tag, value in pairs:
        out += _i(2 | 1 << 10) + _i(1) + _char(tag) + value
    return out + _i(254)


def _vec(sxp: int, payload: bytes, n: int, attrs: list[tuple[str, bytes]] | None = None) -> bytes:
    return _i(sxp | (1 << 9 if attrs else 0)) + _i(n) + payload + (_attrs(attrs) if attrs else b"")


def _strs(values: list[str | None], **kw) -> bytes:
    return _vec(16, b"".join(_char(v) for v in values), len(values), **kw)


def _ints(values: list[int], **kw) -> bytes:
    return _vec(13, b"".join(_i(v) for v in values), len(values), **kw)


def _serialize(obj: bytes) -> bytes:
    return b"X\n" + _i(3) + _i(0x040201) + _i(0x030500) + _i(5) + b"UTF-8" + obj


def test_read_rds_vectors_factors_and_data_frames() -> None:
    factor = _ints([1, 2, 1], attrs=[("levels", _strs(["x", "y"])), ("class", _strs(["factor"]))])
    frame = _vec(
        19,
        _strs(["a", None]) + _ints([1, -(2**31)]) + _vec(14, struct.pack(">2d", 0.5, 2.0), 2),
        3,
        attrs=[
            ("names", _strs(["word", "n", "score"])),
            ("class", _strs(["data.frame"])),
            ("row.names", _ints([-(2**31), -2])),
        ],
    )
    assert rdata.read_rds(gzip.compress(_serialize(frame))) == {
        "word": ["a", None],
        "n": [1, None],
        "score": [0.5, 2.0],
    }
    assert rdata.read_rds(_serialize(factor)) == ["x", "y", "x"]
    latin = _vec(16, _char("caf\xe9", latin1=True), 1)
    assert rdata.read_rds(lzma.compress(_serialize(latin))) == ["caf\xe9"]
    with pytest.raises(ValueError, match="Not an R XDR"):
        rdata.read_rds(b"RDX2\n")


@pytest.mark.parametrize("compression", [1, 3])
def test_read_lazyload_db(tmp_path: Path, compression: int) -> None:
    blobs, offsets = b"", []
    for value in (_strs(["line one", "", "line two"]), _ints([7])):
        raw = _serialize(value)
        blob = _i(len(raw)) + (zlib.compress(raw) if compression == 1 else b"X" + lzma.compress(raw))
        offsets.append((len(blobs), len(blob)))
        blobs += blob
    variables = _vec(19, b"".join(_ints(list(o)) for o in offsets), 2, attrs=[("names", _strs(["novel", "n"]))])
    index = _vec(
        19,
        variables + _vec(19, b"", 0) + _vec(10 if compression == 1 else 13, _i(compression), 1),
        3,
        attrs=[("names", _strs(["variables", "references", "compressed"]))],
    )
    (tmp_path / "Rdata.rdx").write_bytes(gzip.compress(_serialize(index)))
    (tmp_path / "Rdata.rdb").write_bytes(blobs)
    db = rdata.read_lazyload_db(tmp_path / "Rdata.rdx", tmp_path / "Rdata.rdb")
    assert db == {"novel": ["line one", "", "line two"], "n": [7]}


# ---------------------------------------------------------------------------------------------
# load_prompts / load_text_corpus on synthetic corpora
# ---------------------------------------------------------------------------------------------


@pytest.fixture
def synthetic_corpora(monkeypatch: pytest.MonkeyPatch) -> None:

    def prose(doc: int) -> str:  # ~670 words; documents share no sentence
        sentence = "Document {} line {} says the quick brown fox jumps over the lazy dog."
        return "\n\n".join(" ".join(sentence.format(doc, 8 * p + i) for i in range(8)) for p in range(6))

    monkeypatch.setattr(
        corpora,
        "read_humaneval",
        lambda: [
            corpora.CodeProblem(f"HumanEval/{i}", f"def f{i}():\n", f"f{i}", "    return 1\n", "") for i in range(60)
        ],
    )
    code = "def g(x):\n    '''Double x.'''\n" + "    x = x + 0\n" * 6 + "    return 2 * x\n"
    header = "def g(x):\n    '''Double x.'''\n"
    monkeypatch.setattr(
        corpora,
        "read_stdlib_code",
        lambda: [corpora.CodeChunk(f"m{i % 30}.py", f"g{i}", "function", code, header) for i in range(120)],
    )
    monkeypatch.setattr(
        corpora,
        "read_gsm8k",
        lambda: [corpora.MathProblem(f"{i:04d}", f"Question {i}?", f"1+1=<<1+1=2>>2\n#### {i}") for i in range(300)],
    )
    monkeypatch.setattr(
        corpora,
        "read_mt_bench",
        lambda: [corpora.ChatQuestion(str(80 + i), "writing", (f"Turn one {i}", f"Turn two {i}")) for i in range(80)],
    )
    for name in ("read_lee_news", "read_enwiki", "read_austen"):
        monkeypatch.setattr(
            corpora,
            name,
            lambda: [corpora.TextDocument(f"book/ch{i:02d}", f"Book, chapter {i}", prose(i)) for i in range(50)],
        )


@pytest.mark.usefixtures("synthetic_corpora")
def test_load_prompts_schema_and_disjoint_splits() -> None:
    train = load_prompts("all", "train")
    evals = load_prompts("all", "eval")
    assert train.features == evals.features == PROMPT_FEATURES
    assert set(train["domain"]) == set(evals["domain"]) == set(DOMAINS)
    for domain in DOMAINS:
        tr = [(r["source"], r["doc_id"]) for r in train if r["domain"] == domain]
        ev = [(r["source"], r["doc_id"]) for r in evals if r["domain"] == domain]
        assert tr and 0 < len(ev) <= EVAL_PROMPTS_PER_DOMAIN
        assert not set(tr) & set(ev)
    assert len(set(train["id"])) == len(train)
    code_eval = evals.filter(lambda r: r["domain"] == "code")
    assert set(code_eval["source"]) == {"humaneval"}  # stdlib prompts are training-only
    chat = train.filter(lambda r: r["domain"] == "chat")
    assert all(len(t) == 2 and t[0] == p for t, p in zip(chat["turns"], chat["prompt"], strict=True))
    assert train.filter(lambda r: r["domain"] == "math")[0]["prompt"].endswith("within \\boxed{}.")
    fiction = train.filter(lambda r: r["domain"] == "fiction")
    assert all(150 // 2 <= len(p.split("\n\n", 1)[1].split()) <= 250 for p in fiction["prompt"])
    assert Counter(fiction["doc_id"]).most_common(1)[0][1] <= prompts.MAX_PROMPTS_PER_DOCUMENT["fiction"]


@pytest.mark.usefixtures("synthetic_corpora")
def test_load_prompts_limit_seed_and_validation() -> None:
    a = load_prompts(DEFAULT_TRAIN_DOMAINS, "train", limit_per_domain=5, seed=1)
    assert Counter(a["domain"]) == {d: 5 for d in DEFAULT_TRAIN_DOMAINS}
    assert load_prompts(DEFAULT_TRAIN_DOMAINS, "train", limit_per_domain=5, seed=1)["id"] == a["id"]
    assert (
        load_prompts("math", "train", limit_per_domain=5, seed=2)["id"]
        != a.filter(lambda r: r["domain"] == "math")["id"]
    )
    assert load_prompts("news", "eval", limit_per_domain=3)["id"] == load_prompts("news", "eval")["id"][:3]
    assert not set(DEFAULT_TRAIN_DOMAINS) & set(HELD_OUT_DOMAINS)
    with pytest.raises(ValueError, match="Unknown domain"):
        load_prompts("poetry")
    with pytest.raises(ValueError, match="split"):
        load_prompts("math", "test")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="limit_per_domain"):
        load_prompts("math", limit_per_domain=-1)


@pytest.mark.usefixtures("synthetic_corpora")
def test_load_text_corpus_honours_document_split() -> None:
    train = load_text_corpus("all", "train", chunk_words=100)
    evals = load_text_corpus("all", "eval", chunk_words=100)
    assert train.features == TEXT_FEATURES
    assert not {(r["source"], r["doc_id"]) for r in train} & {(r["source"], r["doc_id"]) for r in evals}
    prose = train.filter(lambda r: r["domain"] == "wiki")
    assert all(25 <= len(t.split()) <= 100 for t in prose["text"])
    math = train.filter(lambda r: r["domain"] == "math")
    assert "<<" not in math[0]["text"] and "####" in math[0]["text"]
    # The eval prompts' documents are all in the eval text corpus.
    eval_docs = {(r["source"], r["doc_id"]) for r in evals}
    assert {(r["source"], r["doc_id"]) for r in load_prompts("all", "eval")} <= eval_docs


# ---------------------------------------------------------------------------------------------
# User prompt sets
# ---------------------------------------------------------------------------------------------


def _write_lines(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_load_prompts_jsonl_reads_rows(tmp_path: Path) -> None:
    path = _write_lines(
        tmp_path / "mine.jsonl",
        [
            json.dumps({"prompt": "Hello", "domain": "chat"}),
            "",
            json.dumps({"turns": ["First", "Second"], "domain": "chat", "id": 7}),
            json.dumps({"prompt": "Fix this bug", "extra": 1}),
        ],
    )
    ds = load_prompts_jsonl(path, default_domain="support")
    assert ds.features == PROMPT_FEATURES
    assert ds["prompt"] == ["Hello", "First", "Fix this bug"]
    assert ds["id"] == ["mine/1", "7", "mine/4"]
    assert ds["domain"] == ["chat", "chat", "support"]
    assert ds["turns"] == [["Hello"], ["First", "Second"], ["Fix this bug"]]
    assert set(ds["source"]) == {"mine.jsonl"}


def test_load_prompts_jsonl_reports_bad_lines(tmp_path: Path) -> None:
    path = _write_lines(
        tmp_path / "bad.jsonl",
        [
            json.dumps({"prompt": "ok", "domain": "code"}),
            '{"prompt": "unterminated',
            json.dumps({"promt": "typo", "domain": "code"}),
            json.dumps({"prompt": "no domain"}),
            json.dumps(["not", "an", "object"]),
            json.dumps({"prompt": "", "domain": "code"}),
        ],
    )
    with pytest.raises(ValueError) as info:
        load_prompts_jsonl(path)
    message = str(info.value)
    assert "5 bad line(s)" in message
    assert "line 2: not valid JSON" in message
    assert "line 3: missing 'prompt' (keys found: domain, promt)" in message
    assert "line 4: missing 'domain'" in message and "default_domain" in message
    assert "line 5: expected a JSON object, got list" in message
    assert "line 6: 'prompt' must be a non-empty string" in message
    assert "line 1" not in message
    with pytest.raises(FileNotFoundError):
        load_prompts_jsonl(tmp_path / "missing.jsonl")


def test_as_prompt_dataset_renames_and_fills() -> None:
    ds = Dataset.from_dict({"question": ["a?", "b?"], "answer": ["1", "2"]})
    out = as_prompt_dataset(ds, prompt_column="question", domain="qa")
    assert out.features == PROMPT_FEATURES
    assert out["prompt"] == ["a?", "b?"] and out["domain"] == ["qa", "qa"]
    assert out["id"] == ["user/0", "user/1"] and out["turns"] == [["a?"], ["b?"]]
    kept = as_prompt_dataset(Dataset.from_dict({"prompt": ["x"], "domain": ["math"], "id": [3], "source": ["mine"]}))
    assert kept[0] == {"id": "3", "domain": "math", "source": "mine", "doc_id": "3", "prompt": "x", "turns": ["x"]}


def test_as_prompt_dataset_errors() -> None:
    ds = Dataset.from_dict({"text": ["a"]})
    with pytest.raises(ValueError, match=r"no column 'prompt' \(columns: \['text'\]\)"):
        as_prompt_dataset(ds, domain="x")
    with pytest.raises(ValueError, match="no 'domain' column"):
        as_prompt_dataset(ds, prompt_column="text")
    with pytest.raises(ValueError, match="Row 1: column 'text' must hold a non-empty string"):
        as_prompt_dataset(Dataset.from_dict({"text": ["a", ""]}), prompt_column="text", domain="x")
    messages = Dataset.from_dict({"messages": [[{"role": "user", "content": "hi"}]]})
    with pytest.raises(ValueError, match="looks like chat messages"):
        as_prompt_dataset(messages, prompt_column="messages", domain="chat")
    with pytest.raises(TypeError, match="pass one split"):
        as_prompt_dataset(DatasetDict({"train": ds}))
    with pytest.raises(TypeError, match="datasets.Dataset"):
        as_prompt_dataset([{"prompt": "a"}])  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------------
# Real corpora (downloads on first run)
# ---------------------------------------------------------------------------------------------


@pytest.mark.real_model
def test_real_corpora_row_counts() -> None:
    assert len(corpora.read_humaneval()) == 164
    assert len(corpora.read_gsm8k()) == 1319
    mt_bench = corpora.read_mt_bench()
    assert len(mt_bench) == 80 and len({q.category for q in mt_bench}) == 8
    assert all(len(q.turns) == 2 for q in mt_bench)
    assert len(corpora.read_lee_news()) == 343  # 350 lines, 7 repeats
    assert 90 <= len(corpora.read_enwiki()) <= 110
    chapters = corpora.read_austen()
    assert Counter(c.doc_id.split("/")[0] for c in chapters) == {
        "prideprejudice": 61,
        "emma": 55,
        "sensesensibility": 50,
        "mansfieldpark": 48,
        "northangerabbey": 31,
        "persuasion": 24,
    }
    stdlib = corpora.read_stdlib_code()
    assert len(stdlib) > 5000 and not any(c.doc_id.startswith(("test/", "idlelib/")) for c in stdlib)


@pytest.mark.real_model
@pytest.mark.parametrize("domain", DOMAINS)
def test_real_prompts_disjoint(domain: str) -> None:
    train, evals = load_prompts(domain, "train"), load_prompts(domain, "eval")
    assert len(train) > 50 and 10 <= len(evals) <= EVAL_PROMPTS_PER_DOMAIN
    assert not set(train["doc_id"]) & set(evals["doc_id"])
    assert not set(train["prompt"]) & set(evals["prompt"])
    text_train, text_eval = load_text_corpus(domain, "train"), load_text_corpus(domain, "eval")
    assert not {(r["source"], r["doc_id"]) for r in text_train} & {(r["source"], r["doc_id"]) for r in text_eval}
    assert not set(text_train["text"]) & set(text_eval["text"])


def test_eval_halves_follow_their_hash_rule_and_split_the_eval_prompts() -> None:
    from adaflash_hf.data import eval_half
    from adaflash_hf.serving.loadtest import ConcurrencyBenchArgs, bench_prompts

    for source, doc_id in [("humaneval", "HumanEval/4"), ("gsm8k", "0002"), ("lee", "lee/003")]:
        digest = hashlib.sha256(f"eval-half/{source}/{doc_id}".encode()).digest()
        expected = "tuning" if int.from_bytes(digest[:8], "big") / 2**64 < 0.5 else "validation"
        assert eval_half(source, doc_id) == expected
    halves = Counter(eval_half("synthetic", str(i)) for i in range(4_000))
    assert abs(halves["tuning"] / 4_000 - 0.5) < 0.03
    tuning = bench_prompts(ConcurrencyBenchArgs(prompts="tuning", domains="code,math"))
    validation = bench_prompts(ConcurrencyBenchArgs(prompts="validation", domains="code,math"))
    everything = bench_prompts(ConcurrencyBenchArgs(prompts="eval", domains="code,math"))
    assert not set(tuning) & set(validation) and sorted(tuning + validation) == sorted(everything)
