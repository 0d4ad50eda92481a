"""Replay logged rounds through throughput-guard settings offline: which rule realises most, without the noise.

``adaflash bench --concurrency ... --round-log rounds.jsonl`` logs every round of the adaptive method as its throughput
guard saw it: rows, whether it proposed, explored or re-measured, tokens per row and its time in plain steps of that
many rows. This script takes the measured passes' rounds, and for each batch-size bucket (rows 2-3, 4-7, 8-15, ...)
three pools: speculative rounds as the policy runs them (proposed, not re-measuring), re-measuring rounds (the first of
an explored burst) and plain steps. It replays each pool through a fresh
:class:`~adaflash_hf.decoding.throughput_guard.ThroughputGuard` per setting: every round the guard decides, and the
round's outcome is drawn from the pool its decision calls for, speculative rounds in blocks of consecutive logged
rounds (which keeps the runs of good and bad batches the log saw). It prints, per bucket, the rate (tokens per row per
plain step's time) of plain steps only, of speculating every round and of each setting, with the share of rounds each
setting speculated, and writes JSON with its provenance::

    python benchmarks/profile/guard_replay.py --log rounds.jsonl \\
        --settings '{"default": {}, "explore 8": {"explore_every": 8}}'

A replay assumes a round's outcome does not depend on what the guard decided before it (a resumed drafter's catch-up,
the batch's desync and the cost model's drift are in the logged times only as they happened), so it ranks rules
cheaply; a served benchmark on a prompt split not used for tuning confirms the winner.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path

from adaflash_hf.cli_args import add_dataclass_arguments, dataclass_from_args


@dataclass
class ReplayArgs:
    log: str = field(default="rounds.jsonl", metadata={"help": "Round log of `adaflash bench --round-log`."})
    method: str = field(default="adaflash", metadata={"help": "Which method's rounds to replay."})
    settings: str = field(
        default='{"default": {}}',
        metadata={"help": "JSON object: a name per setting, each a dict of ThroughputGuard arguments."},
    )
    rounds: int = field(default=3000, metadata={"help": "Rounds replayed per bucket, setting and seed."})
    seeds: int = field(default=20, metadata={"help": "Replays per bucket and setting (their rates are averaged)."})
    block: int = field(default=8, metadata={"help": "Consecutive logged speculative rounds drawn together."})
    json: str = field(default="guard_replay.json", metadata={"help": "Where to write the results ('' to skip)."})
    machine_note: str = field(default="", metadata={"help": "Appended to the machine in the provenance."})

    def __post_init__(self):
        if self.rounds < 1 or self.seeds < 1 or self.block < 1:
            raise ValueError("--rounds, --seeds and --block must be >= 1.")
        try:
            settings = json.loads(self.settings)
        except json.JSONDecodeError as error:
            raise ValueError(f"--settings is not JSON ({error}): give e.g. '{{\"default\": {{}}}}'.") from None
        if not isinstance(settings, dict) or not settings or not all(isinstance(v, dict) for v in settings.values()):
            raise ValueError(
                "--settings: give a JSON object of named settings, each a dict of ThroughputGuard arguments."
            )
        from adaflash_hf.decoding.throughput_guard import ThroughputGuard

        for name, kwargs in settings.items():
            try:
                ThroughputGuard(**kwargs)
            except (TypeError, ValueError) as error:
                raise ValueError(f"--settings {name!r}: {error}") from None
        if not Path(self.log).is_file():
            raise FileNotFoundError(f"--log {self.log}: no such file; write one with adaflash bench --round-log.")

    @property
    def setting_map(self) -> dict[str, dict]:
        return json.loads(self.settings)


@dataclass
class Pools:
    """A bucket's logged rounds: (tokens per row, plain steps' time) of each kind, in logged order."""

    rows: int
    speculative: list[tuple[float, float]] = field(default_factory=list)
    remeasuring: list[tuple[float, float]] = field(default_factory=list)
    plain: list[tuple[float, float]] = field(default_factory=list)


def read_pools(path: str, method: str) -> dict[int, Pools]:
    """The measured passes' rounds of ``method`` with two rows or more, by bucket (``rows.bit_length()``)."""
    by_bucket: dict[int, list[dict]] = {}
    for number, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            keep = record["method"] == method and record["pass"] != "warmup" and record["rows"] >= 2
        except (json.JSONDecodeError, KeyError, TypeError) as error:
            raise ValueError(f"{path} line {number} is not a round of adaflash bench --round-log ({error}).") from None
        if keep:
            by_bucket.setdefault(record["rows"].bit_length(), []).append(record)
    if not by_bucket:
        raise ValueError(f"{path}: no measured rounds of {method!r} with two rows or more to replay.")
    pools = {}
    for bucket, records in sorted(by_bucket.items()):
        pool = Pools(rows=int(statistics.median(r["rows"] for r in records)))
        for r in records:
            kind = pool.plain if not r["proposed"] else pool.remeasuring if r["remeasuring"] else pool.speculative
            kind.append((float(r["tokens"]), float(r["steps"])))
        pools[bucket] = pool
    return pools


def rate(rounds: list[tuple[float, float]]) -> float | None:
    return sum(t for t, _ in rounds) / sum(s for _, s in rounds) if rounds else None


def replay(pools: Pools, bucket: int, kwargs: dict, rounds: int, block: int, seed: int) -> tuple[float, float]:
    """Tokens per plain step's time and the share of speculative rounds of one replay."""
    from adaflash_hf.decoding.throughput_guard import ThroughputGuard

    rng, guard = random.Random(seed), ThroughputGuard(**kwargs)
    remeasuring = pools.remeasuring or pools.speculative
    pending: list[tuple[float, float]] = []
    tokens = steps = 0.0
    speculated = 0
    for _ in range(rounds):
        speculative = guard.allows(pools.rows, None)
        if speculative and guard.remeasuring:
            outcome = rng.choice(remeasuring)
        elif speculative:
            if not pending:  # the next block of consecutive logged rounds
                start = rng.randrange(len(pools.speculative))
                pending = list(reversed(pools.speculative[start : start + block]))
            outcome = pending.pop()
        else:
            outcome = rng.choice(pools.plain)
        guard.record(bucket, speculative, outcome[0], outcome[1], None)
        guard.ran(bucket, speculative)
        tokens, steps, speculated = tokens + outcome[0], steps + outcome[1], speculated + speculative
    return tokens / steps, speculated / rounds


def bucket_label(bucket: int) -> str:
    return f"{1 << (bucket - 1)}-{(1 << bucket) - 1}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_dataclass_arguments(parser, ReplayArgs)
    try:
        args = dataclass_from_args(ReplayArgs, parser.parse_args(argv))
        pools = read_pools(args.log, args.method)
    except (ValueError, FileNotFoundError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    from adaflash_hf.provenance import write_script_json

    results = []
    for bucket, pool in pools.items():
        row = {
            "rows": bucket_label(bucket),
            "logged": {k: len(getattr(pool, k)) for k in ("speculative", "remeasuring", "plain")},
            "plain_rate": rate(pool.plain),
            "speculative_rate": rate(pool.speculative),
            "settings": {},
        }
        if pool.speculative and pool.plain:  # a replay needs both kinds of outcome
            for name, kwargs in args.setting_map.items():
                runs = [replay(pool, bucket, kwargs, args.rounds, args.block, seed) for seed in range(args.seeds)]
                row["settings"][name] = {
                    "rate": statistics.fmean(r for r, _ in runs),
                    "speculative_share": statistics.fmean(s for _, s in runs),
                }
        results.append(row)
    names = list(args.setting_map)
    header = f"{'rows':>7} {'logged s/r/p':>14} {'plain':>6} {'spec':>6} " + " ".join(f"{n[:18]:>18}" for n in names)
    print(header)
    print("-" * len(header))
    for row in results:
        logged = "/".join(str(v) for v in row["logged"].values())
        cells = [
            f"{row['settings'][n]['rate']:.3f} ({row['settings'][n]['speculative_share']:.0%})"
            if n in row["settings"]
            else "-"
            for n in names
        ]
        plain = "-" if row["plain_rate"] is None else f"{row['plain_rate']:.3f}"
        spec = "-" if row["speculative_rate"] is None else f"{row['speculative_rate']:.3f}"
        print(f"{row['rows']:>7} {logged:>14} {plain:>6} {spec:>6} " + " ".join(f"{c:>18}" for c in cells))
    print(
        "rates: tokens per row per plain step's time; (share of rounds speculated); logged: speculative/"
        "re-measuring/plain rounds"
    )
    if args.json:
        write_script_json("benchmarks/profile/guard_replay.py", argv, args, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
