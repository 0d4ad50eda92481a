"""How likely a draft token is to be accepted: :class:`AcceptanceEstimator`, its shipped prior
(``acceptance_prior.json``) and the expected accepted length of a candidate.

The estimator keeps bounded counters of how often a draft token was accepted given cheap features of
the proposal (the n-gram length and counts behind a look-up token; the drafter's position and top-1
probability); the expected accepted length of a candidate is the sum of the running products of those
rates (DESIGN §2).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

PRIOR_FILE = "acceptance_prior.json"  # acceptance counts learned offline, shipped beside a drafter (prepare-drafter)
PRIOR_FORMAT = "adaflash-acceptance-prior"


class AcceptanceEstimator:
    """P(draft token accepted | it was verified and every earlier draft was accepted), per feature.

    Bounded counters per ``(source, feature)``. A feature seen only a few times borrows the rate of
    its coarse class (``(source, position, rank)``: the feature's first entry and anything past its
    fourth, such as a runner-up branch's rank), with ``prior_weight`` pseudo-observations, and the
    class borrows the source's prior the same way; so a new, rare feature starts from what similar
    drafts got, not from a fixed guess (rare low-count n-grams and runner-up branches are accepted far
    less often than the source's average). Counts are halved once a key has seen ``max_count``
    drafts, so estimates track a drafter that changes (online adaptation) and memory stays flat in a
    long-running server.
    """

    PRIORS = {"drafter": 0.3, "suffix": 0.5, "global": 0.4, "datastore": 0.3}

    def __init__(self, prior_weight: float = 4.0, max_count: float = 4096.0):
        self.prior_weight, self.max_count = prior_weight, max_count
        self.hits: dict[tuple, float] = {}
        self.seen: dict[tuple, float] = {}

    @staticmethod
    def coarse(feature: tuple) -> tuple:
        return ("class", feature[0], *feature[4:])

    def _rate(self, key: tuple, prior: float) -> float:
        return (self.hits.get(key, 0.0) + self.prior_weight * prior) / (self.seen.get(key, 0.0) + self.prior_weight)

    def rate(self, source: str, feature: tuple) -> float:
        return self._rate((source, feature), self._rate((source, self.coarse(feature)), self.PRIORS[source]))

    def update(self, source: str, features: Sequence[tuple], num_verified: int, num_accepted: int) -> None:
        """Record one verified proposal: drafts 1..num_verified were checked, the first num_accepted passed."""
        for k, feature in enumerate(features[: min(num_verified, num_accepted + 1)]):
            for key in ((source, feature), (source, self.coarse(feature))):
                seen = self.seen.get(key, 0.0) + 1.0
                hits = self.hits.get(key, 0.0) + (k < num_accepted)
                if seen > self.max_count:
                    seen, hits = seen / 2, hits / 2
                self.seen[key], self.hits[key] = seen, hits

    def export(self) -> dict:
        """The counts as JSON-ready data: what :meth:`seed` reads (``acceptance_prior.json`` beside a drafter)."""
        entries = [
            [source, list(feature), round(self.hits.get((source, feature), 0.0), 3), round(seen, 3)]
            for (source, feature), seen in self.seen.items()
        ]
        return {"format": PRIOR_FORMAT, "version": 1, "entries": entries}

    def seed(self, prior: dict, cap: float = 16.0) -> None:
        """Add exported counts as a prior worth at most ``cap`` observations per feature, so the rates start
        where an offline run left them and live traffic takes over after a few dozen rounds."""
        for source, feature, hits, seen in prior["entries"]:
            key = (source, tuple(feature))
            scale = min(1.0, cap / seen) if seen > 0 else 0.0
            self.seen[key] = self.seen.get(key, 0.0) + seen * scale
            self.hits[key] = self.hits.get(key, 0.0) + hits * scale


def load_acceptance_prior(path: str | Path) -> dict:
    """Read an ``acceptance_prior.json``; a malformed one is an error that says how to rebuild or drop it."""
    try:
        prior = json.loads(Path(path).read_text())
        if not isinstance(prior, dict) or prior.get("format") != PRIOR_FORMAT:
            raise ValueError(f"its 'format' is not {PRIOR_FORMAT!r}")
        if not isinstance(prior.get("entries"), list):
            raise ValueError("it has no 'entries' list")
        for entry in prior["entries"]:
            source, feature, hits, seen = entry
            if source not in AcceptanceEstimator.PRIORS or not isinstance(feature, list) or not 0 <= hits <= seen:
                raise ValueError(f"entry {entry!r} is not [source, feature, hits <= seen]")
    except (OSError, ValueError, TypeError) as error:
        raise OSError(
            f"The acceptance prior {path} cannot be read ({error}): rebuild it with `adaflash prepare-drafter "
            "--acceptance-prompts N`, or delete it (the engine then learns acceptance rates from scratch)."
        ) from error
    return prior


def expected_accepted(rates: Sequence[float]) -> float:
    """E[accepted drafts] of a candidate with conditional acceptance rates a_1..a_m: sum_k prod_{j<=k} a_j."""
    total, survive = 0.0, 1.0
    for a in rates:
        survive *= a
        total += survive
    return total
