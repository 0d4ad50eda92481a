"""An ``evaluate`` metric for lossless speculative decoding: tau, accept rate, speed-up and exact match.

Two input formats (``evaluate.load(path, config_name)``), one entry per generation:

- ``"default"``: what adaflash-hf's engine reports per generation (``SpeculativeStats.rounds``, the
  row's entries): ``accept_lengths`` and ``verify_lens`` per round, the two decoding speeds, and
  both outputs' token ids;
- ``"bench"``: the ``records`` of an ``adaflash bench`` JSON, unchanged (every method's records;
  the metric pairs each record of ``spec_method`` with the ``"target"`` record of the same prompt).

Every output is pooled over generations (sums first, then one ratio), as ``adaflash bench`` pools
its rows, so long generations weigh more than short ones.
"""

from __future__ import annotations

import datasets
import evaluate

_DESCRIPTION = """
Speculative decoding quality and speed, from the verification rounds of each generation:
tau (mean accepted length: tokens per target forward, counting the bonus token; plain decoding = 1),
accept rate (accepted drafts / verified drafts), speed-up (pooled speculative tokens per second over
pooled plain tokens per second) and exact match (fraction of generations identical to plain decoding:
1.0 for a lossless method under greedy fp32 decoding).
"""

_KWARGS_DESCRIPTION = """
Args (config "default"), one entry per generation:
    accept_lengths (`list[list[int]]`): drafts accepted in each verification round (the bonus token not
        counted), as in `RoundStats.accept_lengths`.
    verify_lens (`list[list[int]]`): tokens verified in each round (anchor + drafts), as in
        `RoundStats.verify_lens`; same length as `accept_lengths`.
    spec_tokens_per_second (`list[float]`): speed of the speculative generation.
    plain_tokens_per_second (`list[float]`): speed of plain decoding of the same prompt.
    spec_ids (`list[list[int]]`): new token ids of the speculative generation.
    plain_ids (`list[list[int]]`): new token ids of plain decoding.
Args (config "bench"): the `records` of an `adaflash bench` JSON, column by column:
    method, prompt, new_tokens, seconds, forwards, drafts, same (see the README).
    spec_method (`str`, default "adaflash"): the method whose records are scored against "target".
Returns:
    tau (`float`): mean accepted length, counting the bonus token (default: accepted drafts + 1 per
        round; bench: new tokens per target forward, as `adaflash bench` counts it).
    accept_rate (`float` or `None`): accepted drafts / verified drafts; None when no draft was verified.
    speedup (`float`): (sum of speculative tokens / sum of speculative seconds) / (the same for plain
        decoding); default: tokens are the lengths of `spec_ids` / `plain_ids`, seconds tokens / speed.
    exact_match (`float`): fraction of generations whose ids equal plain decoding's (bench: `same`).
Examples:
    >>> metric = evaluate.load("metrics/adaflash_speculative")
    >>> metric.compute(accept_lengths=[[2, 0, 1]], verify_lens=[[4, 4, 4]], spec_tokens_per_second=[30.0],
    ...                plain_tokens_per_second=[20.0], spec_ids=[[5, 6, 7, 8, 9, 10]], plain_ids=[[5, 6, 7, 8, 9, 10]])
    {'tau': 2.0, 'accept_rate': 0.3333333333333333, 'speedup': 1.5, 'exact_match': 1.0}
"""

_CITATION = ""

FEATURES = {
    "default": datasets.Features(
        {
            "accept_lengths": datasets.Sequence(datasets.Value("int64")),
            "verify_lens": datasets.Sequence(datasets.Value("int64")),
            "spec_tokens_per_second": datasets.Value("float64"),
            "plain_tokens_per_second": datasets.Value("float64"),
            "spec_ids": datasets.Sequence(datasets.Value("int64")),
            "plain_ids": datasets.Sequence(datasets.Value("int64")),
        }
    ),
    "bench": datasets.Features(
        {  # field names of adaflash_hf.bench's records
            "method": datasets.Value("string"),
            "prompt": datasets.Value("int64"),
            "new_tokens": datasets.Value("int64"),
            "seconds": datasets.Value("float64"),
            "forwards": datasets.Value("int64"),
            "drafts": datasets.Value("int64"),
            "same": datasets.Value("bool"),
        }
    ),
}
PLAIN_METHOD = "target"  # adaflash bench's plain-decoding method


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class AdaflashSpeculative(evaluate.Metric):
    def _info(self):
        if self.config_name not in FEATURES:
            raise ValueError(
                f"unknown config {self.config_name!r}: use one of {sorted(FEATURES)} "
                "(default: engine rounds and token ids; bench: adaflash bench JSON records)."
            )
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation=_CITATION,
            inputs_description=_KWARGS_DESCRIPTION,
            features=FEATURES[self.config_name],
            reference_urls=["https://arxiv.org/abs/2607.19223"],
        )

    def _compute(self, spec_method="adaflash", **inputs):
        if self.config_name == "bench":
            return bench_scores(spec_method=spec_method, **inputs)
        return round_scores(**inputs)


def round_scores(
    accept_lengths, verify_lens, spec_tokens_per_second, plain_tokens_per_second, spec_ids, plain_ids
) -> dict:
    """Config "default": pooled over generations and their rounds."""
    for i, (accepted, verified) in enumerate(zip(accept_lengths, verify_lens)):
        if len(accepted) != len(verified) or any(not 0 <= a < v for a, v in zip(accepted, verified)):
            raise ValueError(
                f"generation {i}: accept_lengths {accepted} and verify_lens {verified} must pair up round by "
                "round, with 0 <= accepted < verified (verified counts the anchor)."
            )
    if any(not r > 0 for r in [*spec_tokens_per_second, *plain_tokens_per_second]):
        raise ValueError("tokens per second must be > 0 for every generation.")
    rounds = sum(len(a) for a in accept_lengths)
    accepted = sum(sum(a) for a in accept_lengths)
    drafts = sum(v - 1 for lens in verify_lens for v in lens)
    spec_tokens, plain_tokens = sum(map(len, spec_ids)), sum(map(len, plain_ids))
    spec_seconds = sum(len(ids) / r for ids, r in zip(spec_ids, spec_tokens_per_second))
    plain_seconds = sum(len(ids) / r for ids, r in zip(plain_ids, plain_tokens_per_second))
    return {
        "tau": (accepted + rounds) / rounds if rounds else None,
        "accept_rate": accepted / drafts if drafts else None,
        "speedup": (spec_tokens / spec_seconds) / (plain_tokens / plain_seconds)
        if spec_seconds and plain_seconds
        else None,
        "exact_match": sum(list(s) == list(p) for s, p in zip(spec_ids, plain_ids)) / len(spec_ids)
        if spec_ids
        else None,
    }


def bench_scores(method, prompt, new_tokens, seconds, forwards, drafts, same, spec_method="adaflash") -> dict:
    """Config "bench": ``spec_method``'s records against the ``"target"`` record of the same prompt."""
    records = [
        dict(zip(("method", "prompt", "new_tokens", "seconds", "forwards", "drafts", "same"), r))
        for r in zip(method, prompt, new_tokens, seconds, forwards, drafts, same)
    ]
    plain = {r["prompt"]: r for r in records if r["method"] == PLAIN_METHOD}
    spec = [r for r in records if r["method"] == spec_method]
    if not spec:
        raise ValueError(
            f"no records of method {spec_method!r}; methods present: {sorted({r['method'] for r in records})}."
        )
    missing = sorted({r["prompt"] for r in spec} - set(plain))
    if missing:
        raise ValueError(
            f"prompts {missing[:8]} have no {PLAIN_METHOD!r} record to compare with: pass every method's records."
        )
    paired = [plain[r["prompt"]] for r in spec]
    tokens, total_forwards, total_drafts = (sum(r[k] for r in spec) for k in ("new_tokens", "forwards", "drafts"))
    spec_speed = tokens / sum(r["seconds"] for r in spec)
    plain_speed = sum(r["new_tokens"] for r in paired) / sum(r["seconds"] for r in paired)
    return {
        "tau": tokens / total_forwards,
        "accept_rate": max(tokens - total_forwards, 0) / total_drafts if total_drafts else None,
        "speedup": spec_speed / plain_speed,
        "exact_match": sum(bool(r["same"]) for r in spec) / len(spec),
    }
