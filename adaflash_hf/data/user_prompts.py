"""The prompt schema (:data:`PROMPT_FEATURES`, :data:`TEXT_FEATURES`) and user prompt sets in it.

:func:`load_prompts_jsonl` reads ``{"prompt": ..., "domain": ...}`` lines and :func:`as_prompt_dataset`
validates any :class:`datasets.Dataset` with a prompt column into the same schema (for Hub datasets).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from datasets import Dataset, DatasetDict, Features, IterableDataset, List, Value

logger = logging.getLogger(__name__)

PROMPT_FEATURES = Features(
    {
        "id": Value("string"),
        "domain": Value("string"),
        "source": Value("string"),
        "doc_id": Value("string"),
        "prompt": Value("string"),
        "turns": List(Value("string")),
    }
)
TEXT_FEATURES = Features(
    {"text": Value("string"), "domain": Value("string"), "source": Value("string"), "doc_id": Value("string")}
)


def _is_nonempty_str(value: Any) -> bool:
    return isinstance(value, str) and bool(value.strip())


def load_prompts_jsonl(path: str | Path, default_domain: str | None = None) -> Dataset:
    """Read a user prompt set: one JSON object per line with ``"prompt"`` and ``"domain"``.

    Optional keys: ``"id"`` (default ``"<file stem>/<line number>"``), ``"doc_id"`` (default: the
    id; prompts sharing a ``doc_id`` are one document), ``"source"`` (default: the file name) and
    ``"turns"`` (list of user turns; when given without ``"prompt"``, the first turn is the
    prompt). ``default_domain`` fills in lines without ``"domain"``. Blank lines are skipped.
    Raises ``ValueError`` naming each bad line (up to 10) and what is wrong with it.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"Prompt file {path} does not exist.")
    rows: list[dict[str, Any]] = []
    errors: list[str] = []
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as err:
                errors.append(f"line {number}: not valid JSON ({err.msg} at column {err.colno})")
                continue
            if not isinstance(record, dict):
                errors.append(f"line {number}: expected a JSON object, got {type(record).__name__}")
                continue
            row, problem = _user_row(record, default_domain, f"{path.stem}/{number}", path.name)
            if problem:
                errors.append(f"line {number}: {problem}")
            else:
                rows.append(row)
    if errors:
        shown = "\n  ".join(errors[:10]) + (f"\n  … and {len(errors) - 10} more" if len(errors) > 10 else "")
        raise ValueError(
            f"{path}: {len(errors)} bad line(s); each line must be a JSON object like "
            f'{{"prompt": "...", "domain": "code"}} (pass default_domain= to label lines without '
            f"a domain):\n  {shown}"
        )
    if not rows:
        raise ValueError(f"{path} holds no prompts (only blank lines).")
    return Dataset.from_list(rows, features=PROMPT_FEATURES)


def _user_row(
    record: dict[str, Any], default_domain: str | None, default_id: str, default_source: str
) -> tuple[dict[str, Any], str | None]:
    """One schema row from a user record, or an explanation of what is wrong with it."""
    found = f"(keys found: {', '.join(sorted(map(str, record))) or 'none'})"
    turns = record.get("turns")
    if turns is not None and not (isinstance(turns, list) and turns and all(_is_nonempty_str(t) for t in turns)):
        return {}, "'turns' must be a non-empty list of non-empty strings"
    prompt = record.get("prompt", turns[0] if turns else None)
    if prompt is None:
        return {}, f"missing 'prompt' {found}"
    if not _is_nonempty_str(prompt):
        return {}, f"'prompt' must be a non-empty string, got {type(prompt).__name__} {str(prompt)[:40]!r}"
    if turns is not None and turns[0] != prompt:
        return {}, "'turns'[0] must equal 'prompt' (the prompt is the first user turn)"
    domain = record.get("domain", default_domain)
    if domain is None:
        return {}, f"missing 'domain' {found}"
    if not _is_nonempty_str(domain):
        return {}, f"'domain' must be a non-empty string, got {domain!r}"
    row_id = str(record.get("id", default_id))
    return {
        "id": row_id,
        "domain": domain,
        "source": str(record.get("source", default_source)),
        "doc_id": str(record.get("doc_id", row_id)),
        "prompt": prompt,
        "turns": list(turns or [prompt]),
    }, None


def as_prompt_dataset(ds: Dataset, prompt_column: str = "prompt", domain: str | None = None) -> Dataset:
    """Validate a user :class:`datasets.Dataset` and return it in the schema of :data:`PROMPT_FEATURES`.

    ``prompt_column`` must hold non-empty strings (one user turn each). ``domain`` sets the domain
    of every row; without it the dataset needs a ``domain`` column. Optional ``id``, ``source``,
    ``doc_id`` and ``turns`` columns are kept (defaults: ``"user/<row>"``, ``"user"``, the id,
    ``[prompt]``); other columns are dropped.
    """
    if isinstance(ds, DatasetDict):
        raise TypeError(f"Got a DatasetDict with splits {list(ds)}; pass one split, e.g. ds['train'].")
    if isinstance(ds, IterableDataset):
        raise TypeError("Got an IterableDataset; materialise it first, e.g. Dataset.from_list(list(ds.take(n))).")
    if not isinstance(ds, Dataset):
        raise TypeError(f"Expected a datasets.Dataset, got {type(ds).__name__}.")
    if prompt_column not in ds.column_names:
        raise ValueError(
            f"Dataset has no column {prompt_column!r} (columns: {ds.column_names}); "
            "pass prompt_column= naming the column that holds the user prompt."
        )
    if domain is None and "domain" not in ds.column_names:
        raise ValueError(
            f"Dataset has no 'domain' column (columns: {ds.column_names}); pass domain='...' to label every row."
        )
    if domain is not None and not _is_nonempty_str(domain):
        raise ValueError(f"domain must be a non-empty string, got {domain!r}.")

    columns = ds.column_names
    rows = []
    for index, record in enumerate(ds):
        prompt = record[prompt_column]
        if not _is_nonempty_str(prompt):
            hint = (
                " It looks like chat messages: map them to the user-turn text first, e.g. "
                "ds.map(lambda r: {'prompt': r['messages'][0]['content']})."
                if isinstance(prompt, list)
                else ""
            )
            raise ValueError(
                f"Row {index}: column {prompt_column!r} must hold a non-empty string, got "
                f"{type(prompt).__name__} {str(prompt)[:60]!r}.{hint}"
            )
        user = {key: record[key] for key in ("id", "source", "doc_id", "turns") if key in columns}
        user["prompt"] = prompt
        user["domain"] = domain if domain is not None else record["domain"]
        row, problem = _user_row(user, None, f"user/{index}", "user")
        if problem:
            raise ValueError(f"Row {index}: {problem}.")
        rows.append(row)
    dropped = [c for c in columns if c not in PROMPT_FEATURES and c != prompt_column]
    if dropped:
        logger.info("as_prompt_dataset: dropping columns %s", dropped)
    return Dataset.from_list(rows, features=PROMPT_FEATURES)
