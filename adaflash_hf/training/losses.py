"""Training losses of the drafter, as pure functions over tensors.

Shapes: ``N`` blocks, ``K`` supervised block positions (k = 1..K predict the tokens at anchor + k),
``V`` vocabulary. Position k is weighted by exp(-(k-1)/gamma) because a rejection ends the block,
so early positions decide the accepted length (DFlash). The OPD mix follows AdaFlash: cross-entropy
against the target's greedy token plus a reverse KL clipped entry-wise, so a clipped entry has no
gradient.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F


def default_gamma(block_size: int) -> float:
    """DFlash's decay constant: 7 for blocks of 16, 4 for blocks of 8 (about block_size / 2 otherwise)."""
    return {16: 7.0, 8: 4.0}.get(block_size, max(1.0, block_size / 2))


def position_weights(block_size: int, gamma: float, num_positions: int | None = None) -> torch.Tensor:
    """(K,) weights exp(-(k-1)/gamma) for block positions k = 1..K, K = num_positions or block_size - 1."""
    if block_size < 2:
        raise ValueError(f"block_size must be >= 2, got {block_size}.")
    if gamma <= 0 or not math.isfinite(gamma):
        raise ValueError(f"gamma must be a positive finite number, got {gamma}.")
    num = block_size - 1 if num_positions is None else num_positions
    if not 1 <= num <= block_size - 1:
        raise ValueError(f"num_positions must be in [1, {block_size - 1}], got {num}.")
    return torch.exp(-torch.arange(num, dtype=torch.float32) / gamma)


def reach_weights(label_log_probs: torch.Tensor, floor: float = -30.0) -> torch.Tensor:
    """(..., K) log-probabilities the drafter gives each block position's label -> (..., K) reach weights.

    The weight of position k is prod_{j<k} p_j: the drafter's own probability of having drafted positions
    1..k-1 correctly, which is how often verification gets to see position k at all. It replaces the fixed
    exp(-(k-1)/gamma) decay, a batch-wide guess at the same quantity, with each block's own. Position 1
    weighs 1; a block whose first position the drafter gets wrong teaches little about its later ones.
    Detached: the weights steer the loss, they are not optimised. A position without a label should carry
    log-probability 0 (it neither helps nor hurts reach); ``floor`` bounds -inf (a label the drafter cannot
    emit) so the running sum stays finite.
    """
    lp = label_log_probs.detach().float().clamp_min(floor)
    return torch.exp(lp.cumsum(-1) - lp)  # exclusive running product


def weighted_mean(
    per_position: torch.Tensor,
    labels: torch.Tensor,
    weights: torch.Tensor,
    ignore_index: int,
    total: torch.Tensor | None = None,
) -> torch.Tensor:
    """Mean of (N, K) values weighted by position weights (broadcast to (N, K)) over valid labels; 0 when none is.

    ``total`` replaces the sum of the valid weights as the denominator (data-parallel training divides every
    process's sum by the weight of the whole batch, :mod:`.distributed`).
    """
    w = weights.to(per_position.device, per_position.dtype) * (labels != ignore_index)  # (N, K)
    return (per_position * w).sum() / (w.sum() if total is None else total).clamp_min(1e-12)


def decayed_cross_entropy(
    logits: torch.Tensor,
    labels: torch.Tensor,
    weights: torch.Tensor,
    ignore_index: int = -100,
    total: torch.Tensor | None = None,
) -> torch.Tensor:
    """Position-weighted cross-entropy.

    logits (N, K, V), labels (N, K) with ``ignore_index`` where no label exists, weights (K,) (or any
    shape broadcastable to labels, e.g. (n,) for a flat list of n gathered positions with logits (n, V)).
    Returns a scalar: sum w_nk CE_nk / sum w_nk over valid (n, k), or / ``total`` when given.
    """
    return weighted_mean(label_cross_entropy(logits, labels, ignore_index), labels, weights, ignore_index, total)


def label_cross_entropy(logits: torch.Tensor, labels: torch.Tensor, ignore_index: int = -100) -> torch.Tensor:
    """Cross-entropy of each label, (..., V), (...) -> (...); 0 where ``labels == ignore_index``."""
    ce = F.cross_entropy(
        logits.float().reshape(-1, logits.shape[-1]), labels.flatten().clamp_min(0), reduction="none"
    ).view(labels.shape)
    return ce.masked_fill(labels == ignore_index, 0.0)


def decayed_forward_kl(
    draft_logits: torch.Tensor,
    target_logits: torch.Tensor,
    labels: torch.Tensor,
    weights: torch.Tensor,
    ignore_index: int = -100,
    total: torch.Tensor | None = None,
) -> torch.Tensor:
    """Position-weighted KL(p_target || p_draft): distillation on the target's whole distribution.

    draft_logits, target_logits (..., V); labels (...) only marks valid positions (``ignore_index``:
    none); weights broadcastable to labels; ``total`` as in :func:`decayed_cross_entropy`. The soft target
    carries more signal per position than its argmax alone, which matters when supervised positions are the
    scarce resource.
    """
    log_q = F.log_softmax(draft_logits.float(), dim=-1)
    log_p = F.log_softmax(target_logits.detach().float(), dim=-1)
    kl = (log_p.exp() * (log_p - log_q)).sum(-1).masked_fill(labels == ignore_index, 0.0)  # (...)
    return weighted_mean(kl, labels, weights, ignore_index, total)


def clipped_reverse_kl(draft_logits: torch.Tensor, target_logits: torch.Tensor, clip: float) -> torch.Tensor:
    """KL(p_draft || p_target) per position, clamped at ``clip``: (..., V), (..., V) -> (...).

    ``clamp(max=clip)`` has zero gradient where the KL exceeds ``clip``: AdaFlash's entry-wise clipping.
    The target is a fixed teacher (detached).
    """
    log_q = F.log_softmax(draft_logits.float(), dim=-1)
    log_p = F.log_softmax(target_logits.detach().float(), dim=-1)
    kl = (log_q.exp() * (log_q - log_p)).sum(-1)
    return kl.clamp(max=clip)


def opd_loss(
    draft_logits: torch.Tensor,
    target_logits: torch.Tensor,
    labels: torch.Tensor,
    weights: torch.Tensor,
    alpha: float = 0.8,
    clip: float = 0.01,
    ignore_index: int = -100,
) -> torch.Tensor:
    """On-policy distillation loss: alpha * CE(draft, labels) + (1 - alpha) * clipped reverse KL.

    draft_logits, target_logits (N, K, V); labels (N, K), the target's greedy tokens (``ignore_index``
    where none); weights (K,) position decay. Returns the weighted mean over valid (n, k).
    """
    ce = F.cross_entropy(draft_logits.float().flatten(0, 1), labels.flatten().clamp_min(0), reduction="none").view(
        labels.shape
    )  # (N, K)
    kl = clipped_reverse_kl(draft_logits, target_logits, clip)  # (N, K)
    per_position = _mix(ce, kl, alpha).masked_fill(labels == ignore_index, 0.0)
    return weighted_mean(per_position, labels, weights, ignore_index)


def topk_reverse_kl(
    draft_logits: torch.Tensor, teacher_ids: torch.Tensor, teacher_logprobs: torch.Tensor, clip: float
) -> torch.Tensor:
    """KL(p_draft || p_target) from a top-k compressed teacher, clamped at ``clip``: -> (...).

    draft_logits (..., V_draft); teacher_ids (..., k) indices into the draft vocabulary (negative where
    the target's token lies outside it, so the draft gives it probability 0); teacher_logprobs (..., k)
    the target's log-probabilities of those tokens over its full vocabulary. The vocabulary is
    partitioned into the k tokens and one bucket for the rest; merging the tail can only lower the KL
    (log-sum inequality), and with every token listed it is the exact KL. A clamped entry has zero gradient.
    """
    log_q = F.log_softmax(draft_logits.float(), dim=-1)
    inside = teacher_ids >= 0
    index = teacher_ids.clamp_min(0).long()
    log_q_k = log_q.gather(-1, index).masked_fill(~inside, float("-inf"))  # (..., k)
    log_q_rest = log_q.scatter(-1, index, float("-inf")).logsumexp(-1)  # (...) mass outside the k tokens
    log_p_k = teacher_logprobs.detach().float()
    log_p_rest = torch.log1p(-log_p_k.exp().sum(-1).clamp(max=1 - 1e-6))
    q_k = log_q_k.exp()
    listed = torch.where(inside, q_k * (log_q_k - log_p_k), torch.zeros_like(q_k)).sum(-1)
    q_rest = log_q_rest.exp()
    rest = torch.where(q_rest > 0, q_rest * (log_q_rest - log_p_rest), torch.zeros_like(q_rest))
    return (listed + rest).clamp(max=clip)


def opd_topk_loss(
    draft_logits: torch.Tensor,
    teacher_ids: torch.Tensor,
    teacher_logprobs: torch.Tensor,
    weights: torch.Tensor,
    alpha: float = 0.8,
    clip: float = 0.01,
) -> torch.Tensor:
    """AdaFlash's OPD loss on a top-k teacher: alpha * CE(draft, target argmax) + (1 - alpha) * clipped reverse KL.

    draft_logits (n, V_draft); teacher_ids / teacher_logprobs (n, k) sorted by probability, ids as in
    :func:`topk_reverse_kl` (the CE label is the target's argmax, ``teacher_ids[:, 0]``; a position whose
    argmax lies outside the draft vocabulary gives no CE); weights (n,) per position (decay times any
    up-weighting of rejected positions). Returns sum_n w_n loss_n / sum_n w_n.
    """
    labels = teacher_ids[:, 0].long()
    ce = F.cross_entropy(draft_logits.float(), labels.clamp_min(0), reduction="none").masked_fill(labels < 0, 0.0)
    kl = topk_reverse_kl(draft_logits, teacher_ids, teacher_logprobs, clip)
    w = weights.to(draft_logits.device, torch.float32)
    return (_mix(ce, kl, alpha) * w).sum() / w.sum().clamp_min(1e-12)


def _mix(ce: torch.Tensor, kl: torch.Tensor, alpha: float) -> torch.Tensor:
    """AdaFlash's per-position OPD mix: alpha * CE + (1 - alpha) * clipped reverse KL."""
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha must be in [0, 1], got {alpha}.")
    return alpha * ce + (1 - alpha) * kl
