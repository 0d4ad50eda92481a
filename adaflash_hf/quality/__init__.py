"""``adaflash bench --quality``: task results of the target with and without AdaFlash.

In bf16 a multi-token verification pass rounds differently from a one-token decode step, so greedy
outputs of speculative and plain decoding can part at near-ties (see the README). This package checks
that those differences leave task results unchanged, on held-out problems of two benchmarks:

- ``gsm8k``: exact match of the final number with the reference after ``####``;
- ``humaneval``: pass@1, the problem's tests run on the extracted code in a separate, limited process.

Modules: :mod:`~adaflash_hf.quality.problems` (the problems, their answers and scores),
:mod:`~adaflash_hf.quality.sandbox` (the limited process a HumanEval program runs in),
:mod:`~adaflash_hf.quality.stats` (intervals and the paired test) and :mod:`~adaflash_hf.quality.command`
(decoding both methods and the report).
"""
