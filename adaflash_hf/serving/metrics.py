"""Prometheus metrics of one server (``GET /metrics``), in a registry of its own.

Each app gets its own ``CollectorRegistry`` (never prometheus_client's global one), so several servers
in one process, tests included, do not collide. Two kinds of series:

* request metrics, counted by the HTTP layer as requests end (:class:`~.generation.Generation` and the
  error handlers): requests by outcome, prompt and generated tokens, end-to-end latency, time to first
  token and time per output token;
* engine metrics, read from the scheduler at scrape time (:class:`SchedulerCollector`): running and
  waiting requests, the last round's batch size, accepted draft tokens per round, drafts proposed and
  accepted by source and position, and the OPD adapter version and trainer state.

Everything is a counter, a gauge or a fixed-bucket histogram: memory stays bounded however long the
server runs. The names and their meaning are tabled in ``docs/guides/deployment.md``.
"""

from __future__ import annotations

import logging

logger = logging.getLogger(__name__)

# Request outcomes, the values of adaflash_requests_total's "outcome" label.
OUTCOMES = ("success", "cancelled", "timeout", "error", "rejected", "unauthorized", "rate_limited", "unavailable")
LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0, 320.0)
TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0)
TPOT_BUCKETS = (0.002, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0)
ACCEPTED_BUCKETS = (0, 1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 15)  # draft tokens accepted by one row in one round


def outcome_of_status(status: int) -> str:
    """The outcome label of a request answered with HTTP ``status`` before it generated anything."""
    return {401: "unauthorized", 408: "timeout", 429: "rate_limited", 503: "unavailable"}.get(
        status, "error" if status >= 500 else "rejected"
    )


class ServingMetrics:
    """The metrics of one server over ``scheduler``; `render` gives the Prometheus text exposition."""

    def __init__(self, scheduler):
        from prometheus_client import CollectorRegistry, Counter, Histogram

        self.registry = CollectorRegistry()
        self.requests = Counter(
            "adaflash_requests",
            "Generation requests (/v1/completions, /v1/chat/completions) by outcome.",
            ["outcome"],
            registry=self.registry,
        )
        for outcome in OUTCOMES:  # every series exists from the first scrape, at 0
            self.requests.labels(outcome)
        self.prompt_tokens = Counter(
            "adaflash_prompt_tokens", "Prompt tokens of admitted requests.", registry=self.registry
        )
        self.generated_tokens = Counter(
            "adaflash_generation_tokens", "Tokens generated and sent to clients.", registry=self.registry
        )
        self.latency = Histogram(
            "adaflash_request_latency_seconds",
            "Seconds from submission to the last token (or the error) of a request.",
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.ttft = Histogram(
            "adaflash_time_to_first_token_seconds",
            "Seconds from submission to a request's first token.",
            buckets=TTFT_BUCKETS,
            registry=self.registry,
        )
        self.tpot = Histogram(
            "adaflash_time_per_output_token_seconds",
            "Seconds per output token after the first, per request.",
            buckets=TPOT_BUCKETS,
            registry=self.registry,
        )
        self.registry.register(SchedulerCollector(scheduler))

    def count_rejection(self, status: int) -> None:
        """A generation request that ended with HTTP ``status`` before anything was generated."""
        self.requests.labels(outcome_of_status(status)).inc()

    def render(self) -> tuple[bytes, str]:
        """(body, content type) of the text exposition."""
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        return generate_latest(self.registry), CONTENT_TYPE_LATEST


class SchedulerCollector:
    """Engine series read from the scheduler's bounded statistics at each scrape."""

    def __init__(self, scheduler):
        self.scheduler = scheduler

    def describe(self):
        return []  # the series depend on what the engine has seen; describe nothing up front

    def collect(self):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
        from prometheus_client.utils import floatToGoString

        status = self.scheduler.status()
        stats = self.scheduler.round_stats()
        yield GaugeMetricFamily("adaflash_requests_running", "Requests in the running batch.", value=status["active"])
        yield GaugeMetricFamily("adaflash_requests_waiting", "Requests queued for admission.", value=status["queued"])
        yield GaugeMetricFamily(
            "adaflash_batch_size", "Rows the last round verified (0 once the engine idles).", value=stats["batch_size"]
        )
        accepted = {tokens - 1: rows for tokens, rows in stats["round_tokens"].items()}
        buckets = [
            (floatToGoString(le), sum(rows for a, rows in accepted.items() if a <= le)) for le in ACCEPTED_BUCKETS
        ]
        yield HistogramMetricFamily(
            "adaflash_accepted_tokens_per_round",
            "Draft tokens one row accepted in one round (the target's own "
            "token not counted: tokens per round = this + 1).",
            buckets=buckets + [("+Inf", sum(accepted.values()))],
            sum_value=sum(a * n for a, n in accepted.items()),
        )
        proposed = CounterMetricFamily(
            "adaflash_draft_tokens_proposed",
            "Draft tokens verified, by source and position (1: the draft after the anchor).",
            labels=["source", "position"],
        )
        taken = CounterMetricFamily(
            "adaflash_draft_tokens_accepted",
            "Draft tokens accepted, by source and position.",
            labels=["source", "position"],
        )
        for (source, position), (n_proposed, n_accepted) in sorted(stats["drafts"].items()):
            proposed.add_metric([source, str(position)], n_proposed)
            taken.add_metric([source, str(position)], n_accepted)
        yield proposed
        yield taken
        yield CounterMetricFamily(
            "adaflash_draft_failures",
            "Rows whose drafter or length head raised or returned NaN in a round; each took a plain step instead.",
            value=status["counters"]["draft_failures"],
        )
        opd = status.get("opd")
        if opd is not None:
            yield GaugeMetricFamily(
                "adaflash_opd_adapter_version",
                "Adapter version the serving drafter uses (0: the base drafter).",
                value=opd["adapter_version"],
            )
            state = GaugeMetricFamily(
                "adaflash_opd_trainer_state", "1 for the OPD trainer's current state.", labels=["state"]
            )
            state.add_metric([opd["state"]], 1)
            yield state
