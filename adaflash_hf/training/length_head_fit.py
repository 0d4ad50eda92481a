"""Fitting and scoring the length head on acceptance records.

Loss. A discrete survival model: draft k is *at risk* when drafts < k were accepted and k was
verified, i.e. k <= min(accepted + 1, verified); it is a success when k <= accepted. Binary
cross-entropy over the at-risk positions only (:func:`survival_loss`); positions after the first
rejection or past the verified length carry no label.

Evaluation on records of held-out (eval split) prompts, against the engine's
:class:`~adaflash_hf.decoding.acceptance.AcceptanceEstimator` as the policy received it, that
estimator's features refit on the training records, and per-position constants: per-position log-loss
and Brier score, and the error of the expected accepted length.
"""

from __future__ import annotations

import math
import time

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from ..decoding.proposers.drafter import drafter_feature
from ..modeling_length_head import AdaFlashLengthHead
from .length_head_records import AcceptanceRecords


def survival_targets(
    accept_lengths: torch.Tensor, num_verified: torch.Tensor, num_drafts: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Labels and at-risk mask (N, num_drafts) of the conditional acceptance of drafts 1..num_drafts.

    Draft k is at risk when k <= min(accepted + 1, verified): every earlier draft was accepted and k
    was checked. Its label is 1 when it was accepted (k <= accepted).
    """
    k = torch.arange(1, num_drafts + 1, device=accept_lengths.device)[None]  # (1, m)
    labels = (k <= accept_lengths[:, None]).float()
    mask = k <= torch.minimum(accept_lengths + 1, num_verified)[:, None]
    return labels, mask


def survival_loss(logits: torch.Tensor, accept_lengths: torch.Tensor, num_verified: torch.Tensor) -> torch.Tensor:
    """Mean binary cross-entropy of conditional-acceptance logits (N, m) over the at-risk positions only."""
    labels, mask = survival_targets(accept_lengths, num_verified, logits.shape[1])
    losses = F.binary_cross_entropy_with_logits(logits.float(), labels, reduction="none")
    return (losses * mask).sum() / mask.sum().clamp_min(1)


def expected_accepted(rates: torch.Tensor, num_verified: torch.Tensor | None = None) -> torch.Tensor:
    """E[accepted drafts] (N,) from conditional rates (N, m): sum_k prod_{j<=k} a_j, over the first num_verified
    drafts."""
    survival = rates.float().cumprod(-1)
    if num_verified is not None:
        survival = survival * (torch.arange(1, rates.shape[1] + 1)[None] <= num_verified[:, None])
    return survival.sum(-1)


def calibration(rates: torch.Tensor, accept_lengths: torch.Tensor, num_verified: torch.Tensor) -> dict:
    """Held-out quality of conditional acceptance rates (N, m): log-loss and Brier per position and overall, and
    the error of the expected accepted length against the accepted length (same drafts verified)."""
    labels, mask = survival_targets(accept_lengths, num_verified, rates.shape[1])
    p = rates.float().clamp(1e-4, 1 - 1e-4)
    log_loss = -(labels * p.log() + (1 - labels) * (1 - p).log())
    brier = (p - labels) ** 2
    count = mask.sum(0).clamp_min(1)
    predicted = expected_accepted(rates, num_verified)
    error = predicted - accept_lengths.float()
    return {
        "log_loss": float((log_loss * mask).sum() / mask.sum()),
        "brier": float((brier * mask).sum() / mask.sum()),
        "log_loss_per_position": [round(float(v), 4) for v in (log_loss * mask).sum(0) / count],
        "brier_per_position": [round(float(v), 4) for v in (brier * mask).sum(0) / count],
        "at_risk_per_position": mask.sum(0).tolist(),
        "length_mae": float(error.abs().mean()),
        "length_rmse": float(error.pow(2).mean().sqrt()),
        "length_bias": float(error.mean()),
        "mean_predicted_length": float(predicted.mean()),
        "mean_accepted_length": float(accept_lengths.float().mean()),
    }


def table_rates(fit: AcceptanceRecords, evaluate: AcceptanceRecords, use_top_prob: bool = True) -> torch.Tensor:
    """Rates for ``evaluate`` from a table of acceptance counts on ``fit``, keyed by the engine estimator's drafter
    feature (position and top-1 probability bin; position only without ``use_top_prob``): the best that
    estimator's features can do once its counters have converged on this traffic."""
    num_drafts = fit.rates.shape[1]

    def keys(records: AcceptanceRecords) -> torch.Tensor:
        bins = torch.tensor(
            [
                [drafter_feature(k, float(p))[1] if use_top_prob else 0 for k, p in enumerate(row)]
                for row in records.top_probs.tolist()
            ]
        )
        return torch.arange(num_drafts)[None] * 5 + bins  # (N, m) cell index

    labels, mask = survival_targets(fit.accept_lengths, fit.num_verified, num_drafts)
    cells = keys(fit)[mask]
    hits = torch.zeros(num_drafts * 5).index_add_(0, cells, labels[mask])
    seen = torch.zeros(num_drafts * 5).index_add_(0, cells, torch.ones_like(labels[mask]))
    table = (hits + 1) / (seen + 2)  # Laplace smoothing for cells never seen
    return table[keys(evaluate)]


# ---------------------------------------------------------------------------------------------
# Fitting
# ---------------------------------------------------------------------------------------------


@torch.no_grad()
def predict_logits(head: AdaFlashLengthHead, records: AcceptanceRecords, chunk: int = 1024) -> torch.Tensor:
    """The head's conditional-acceptance logits (N, B-1) for every record, from its block states and the engine's
    rates."""
    return torch.cat(
        [
            head(records.draft_hidden_states[i : i + chunk].float(), records.rates[i : i + chunk]).logits.float()
            for i in range(0, len(records), chunk)
        ]
    )


def fit_head(
    head: AdaFlashLengthHead,
    train: AcceptanceRecords,
    validation: AcceptanceRecords,
    epochs: int,
    lr: float,
    weight_decay: float,
    batch_size: int,
    seed: int,
) -> list[dict]:
    """AdamW on :func:`survival_loss` with a cosine decay to 0; keeps the epoch with the lowest validation loss.

    The decay matters: at a constant lr the held-out loss of consecutive epochs swung by +-0.01, as much
    as the head gains over the engine's estimator (``docs/research-log.md``).
    """
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.AdamW(head.parameters(), lr=lr, weight_decay=weight_decay)
    total_steps = epochs * math.ceil(len(train) / batch_size)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: 0.5 * (1 + math.cos(math.pi * step / total_steps))
    )
    history, best, best_state = [], math.inf, None
    for epoch in tqdm(range(epochs), desc="train length head", unit="epoch"):
        head.train()
        order = torch.randperm(len(train), generator=generator)
        total = 0.0
        for lo in range(0, len(train), batch_size):
            index = order[lo : lo + batch_size]
            logits = head(train.draft_hidden_states[index].float(), train.rates[index]).logits
            loss = survival_loss(logits, train.accept_lengths[index], train.num_verified[index])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            schedule.step()
            total += float(loss.detach()) * len(index)
        head.eval()
        val_loss = float(
            survival_loss(predict_logits(head, validation), validation.accept_lengths, validation.num_verified)
        )
        history.append({"epoch": epoch + 1, "train_loss": total / len(train), "validation_loss": val_loss})
        if val_loss < best:
            best, best_state = val_loss, {k: v.clone() for k, v in head.state_dict().items()}
    head.load_state_dict(best_state)
    return history


def time_head(head: AdaFlashLengthHead, batch_size: int, repeats: int = 50) -> float:
    """Median seconds of one head forward on a (batch_size, B, H) bf16 input, as the policy runs it."""
    hidden = torch.randn(batch_size, head.config.block_size, head.config.hidden_size, dtype=torch.bfloat16)
    prior = torch.rand(batch_size, head.config.num_drafts)
    seconds = []
    with torch.inference_mode():
        for _ in range(repeats):
            tick = time.perf_counter()
            head(hidden, prior)
            seconds.append(time.perf_counter() - tick)
    return sorted(seconds)[len(seconds) // 2]
