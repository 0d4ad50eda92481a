"""The benchmark problems of ``adaflash bench --quality`` and how an answer is scored.

- ``gsm8k``: exact match of the final number (:func:`extract_answer`) with the reference after ``####``;
- ``humaneval``: pass@1, the problem's tests run on the extracted code (:func:`humaneval_program`)
  in a separate, limited process (:func:`~adaflash_hf.quality.sandbox.run_program`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import TYPE_CHECKING

from ..cli_args import check_choice
from .sandbox import run_program

if TYPE_CHECKING:
    from ..data.corpora import CodeProblem

TASKS = ("gsm8k", "humaneval")
DOMAIN_OF = {"gsm8k": "math", "humaneval": "code"}  # the prompt-set domain holding each task's eval split
METRIC_OF = {"gsm8k": "exact match", "humaneval": "pass@1"}


@dataclass(frozen=True)
class Problem:
    """One benchmark problem, as the target is asked it and as its answer is checked."""

    id: str  # "gsm8k/0314", "humaneval/HumanEval/38": the prompt set's id
    task: str  # one of TASKS
    prompt: str  # the user message, in DFlash's benchmark format
    answer: str = ""  # gsm8k: the reference number, normalised (see normalise_number)
    code: CodeProblem | None = None  # humaneval: signature, tests and entry point
    split: str = "eval"  # the document's split: "train" only where the eval split ran out (see load_problems)


def load_problems(task: str, limit: int) -> list[Problem]:
    """The first ``limit`` problems of ``task``: its held-out eval prompts first, in their fixed order.

    When the eval split holds fewer (HumanEval's holds 30), the rest of the benchmark tops the list
    up in benchmark order, eval-split documents first, then train-split ones; each problem's
    ``split`` says which. A train-split problem's prompt was answered by the target for the drafter's
    training data, which may raise acceptance on it but cannot change whether an answer is right:
    the check compares the target with and without AdaFlash on the same problems.
    """
    from ..data import corpora, document_split, gsm8k_prompt, humaneval_prompt, load_prompts

    check_choice("task", task, TASKS)
    rows = load_prompts(DOMAIN_OF[task], split="eval", limit_per_domain=limit).to_list()
    gsm8k = task == "gsm8k"
    by_id = {p.doc_id: p for p in (corpora.read_gsm8k() if gsm8k else corpora.read_humaneval())}
    prompts = {r["doc_id"]: r["prompt"] for r in rows}  # insertion order: the eval split's fixed order
    rest = sorted(
        (doc_id for doc_id in by_id if doc_id not in prompts), key=lambda doc_id: document_split(task, doc_id) != "eval"
    )  # stable: benchmark order within a split
    for doc_id in rest[: max(0, limit - len(prompts))]:
        prompts[doc_id] = gsm8k_prompt(by_id[doc_id].question) if gsm8k else humaneval_prompt(by_id[doc_id].prompt)
    problems = []
    for doc_id in prompts:
        split = document_split(task, doc_id)
        if gsm8k:
            problems.append(
                Problem(
                    f"gsm8k/{doc_id}", task, prompts[doc_id], answer=reference_answer(by_id[doc_id].answer), split=split
                )
            )
        else:
            problems.append(Problem(f"humaneval/{doc_id}", task, prompts[doc_id], code=by_id[doc_id], split=split))
    return problems


# ---------------------------------------------------------------------------------------------
# GSM8K: the final number
# ---------------------------------------------------------------------------------------------

# A number with thousands separators ("1,234.5") or without ("-12", "3.75").
_NUMBER = re.compile(r"-?\d{1,3}(?:,\d{3})+(?:\.\d+)?|-?\d+(?:\.\d+)?")


def normalise_number(text: str) -> str | None:
    """A number's canonical spelling: no commas, no trailing zeros after the point ("1,080.00" -> "1080")."""
    try:
        value = Decimal(text.replace(",", "").strip())
    except InvalidOperation:
        return None
    return format(value.normalize(), "f") if value.is_finite() else None


def boxed_content(text: str) -> str | None:
    """What the last complete ``\\boxed{...}`` of ``text`` holds (braces may nest); None if there is none."""
    for start in reversed([m.end() for m in re.finditer(r"\\boxed\{", text)]):
        depth = 1
        for i in range(start, len(text)):
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            if depth == 0:
                return text[start:i]
    return None


def extract_answer(completion: str) -> str | None:
    """The final number of an answer: the last number inside the last ``\\boxed{}``, else the last number of the
    text."""
    boxed = boxed_content(completion)
    for text in ([boxed] if boxed is not None else []) + [completion]:
        numbers = _NUMBER.findall(text)
        if numbers:
            return normalise_number(numbers[-1])
    return None


def reference_answer(solution: str) -> str:
    """The normalised number after ``####`` in a GSM8K reference solution."""
    number = normalise_number(solution.rpartition("####")[2])
    if number is None:
        raise ValueError(f"a GSM8K solution must end with '#### <number>', got ...{solution[-80:]!r}.")
    return number


# ---------------------------------------------------------------------------------------------
# HumanEval: the program
# ---------------------------------------------------------------------------------------------

# An opening fence with an optional language tag, up to the closing fence (or the end of a cut-off answer).
_FENCE = re.compile(r"```[\w+-]*[ \t]*\n(.*?)(?:```|\Z)", re.DOTALL)


def extract_code(completion: str, entry_point: str) -> str:
    """The completion's code: the first fenced block defining ``entry_point``, else its first block, else all of it."""
    blocks = _FENCE.findall(completion)
    defining = [b for b in blocks if _defines(b, entry_point)]
    return (defining or blocks or [completion])[0]


def _defines(code: str, name: str) -> bool:
    return re.search(rf"^\s*def {re.escape(name)}\s*\(", code, re.MULTILINE) is not None


def humaneval_program(problem: CodeProblem, completion: str) -> str:
    """The program whose clean exit is a pass: the prompt and the answer's code, the tests, ``check(entry_point)``.

    The prompt comes first either way: it holds the imports and helper functions the tests rely on. A
    full definition of the entry point in the answer then replaces the prompt's stub; code without
    one is taken as the stub's body.
    """
    code = extract_code(completion, problem.entry_point)
    body = f"{problem.prompt}\n{code}" if _defines(code, problem.entry_point) else problem.prompt + code
    return f"{body}\n\n{problem.test}\n\ncheck({problem.entry_point})\n"


# ---------------------------------------------------------------------------------------------
# Scoring
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Score:
    correct: bool
    detail: str  # gsm8k: the extracted answer; humaneval: the run's status and its last output line


def score(problem: Problem, completion: str, timeout_s: float = 10.0) -> Score:
    """Whether ``completion`` solves ``problem`` (GSM8K: exact match; HumanEval: its tests pass)."""
    if problem.task == "gsm8k":
        answer = extract_answer(completion)
        return Score(answer is not None and answer == problem.answer, answer or "")
    result = run_program(humaneval_program(problem.code, completion), timeout_s)
    last_line = result.output.splitlines()[-1] if result.output else ""
    return Score(result.passed, f"{result.status}: {last_line}"[:300])
