"""The drafter's training forward, shared by offline training (``trainer``) and on-line OPD (``online.opd``).

:func:`block_hidden_states` runs the drafter over every sampled block of a batch at once, exactly as
the engine runs it one round at a time (see :mod:`.anchors`); :func:`draft_logits` applies the same
head as inference (the target's lm_head rows of the draft vocabulary, only at labelled positions);
:func:`drafter_block_forward` is the offline step (CE on the target's greedy tokens, optional forward
KL); :func:`acceptance_counts` turns predictions into teacher-forced acceptance.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from accelerate.utils import extract_model_from_parallel
from transformers import PreTrainedModel

from ..modeling_adaflash import AdaFlashDrafter
from ..targets import resolve_dtype
from .anchors import block_attention_mask, block_input_ids, block_labels, block_position_ids
from .data import IGNORE_INDEX, Batch, TargetFeatures
from .losses import decayed_forward_kl, label_cross_entropy, reach_weights, weighted_mean


def compute_dtype(device: torch.device | str, target_dtype: torch.dtype) -> torch.dtype:
    """The dtype the training forward computes in (see :func:`compute_autocast`)."""
    if target_dtype != torch.float32 or resolve_dtype("auto", torch.device(device)) == torch.bfloat16:
        return torch.bfloat16
    return torch.float32


def compute_autocast(device: torch.device | str, target_dtype: torch.dtype) -> contextlib.AbstractContextManager:
    """The training forward's precision: bf16 autocast where bf16 compute is the faster choice (CUDA, or a CPU
    whose bf16 matmuls measure faster: AMX or AVX512-BF16, :func:`adaflash_hf.targets.resolve_dtype`) or where
    the target's features are not fp32 anyway; plain fp32 (a no-op context) for an fp32 target on a CPU that
    emulates bf16 (AVX2 only), where autocast would make every step slower."""
    return autocast_in(device, compute_dtype(device, target_dtype))


def autocast_in(device: torch.device | str, dtype: torch.dtype) -> contextlib.AbstractContextManager:
    """bf16 autocast on ``device`` when ``dtype`` is bf16, else a no-op context (fp32)."""
    if dtype == torch.bfloat16:
        return torch.autocast(torch.device(device).type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def block_hidden_states(
    drafter: AdaFlashDrafter,
    embed: torch.nn.Module,
    input_ids: torch.Tensor,
    context: torch.Tensor,
    anchors: torch.Tensor,
    num_positions: int,
) -> torch.Tensor:
    """Drafter forward over blocks ``[token at a_j, MASK...]`` for every anchor; returns (b, A, K, H).

    ``drafter`` may be wrapped (distributed training, peft); input_ids (b, L) tokens, context (b, L, n*H)
    target features, anchors (b, A). Returned positions k = 1..K predict tokens a_j + k.
    """
    config = extract_model_from_parallel(drafter).config
    block_size = config.block_size
    b, seq_len = input_ids.shape
    num_anchors = anchors.shape[1]
    noise_embeds = embed(block_input_ids(input_ids, anchors, block_size, config.mask_token_id))  # (b, A*B, H)
    position_ids = torch.cat(
        [torch.arange(seq_len, device=input_ids.device).expand(b, -1), block_position_ids(anchors, block_size)], dim=1
    )  # (b, L + A*B)
    compute_dtype = (
        torch.bfloat16 if torch.is_autocast_cpu_enabled() or torch.is_autocast_enabled() else noise_embeds.dtype
    )
    mask = block_attention_mask(anchors, seq_len, block_size, compute_dtype)
    hidden = drafter(
        noise_embeds=noise_embeds, context_hidden_states=context, position_ids=position_ids, attention_mask=mask
    ).last_hidden_state  # (b, A*B, H)
    return hidden.view(b, num_anchors, block_size, -1)[:, :, 1 : 1 + num_positions]  # (b, A, K, H)


def draft_logits(drafter: AdaFlashDrafter, lm_head: torch.nn.Module, hidden: torch.Tensor) -> torch.Tensor:
    """(n, H) hidden states -> (n, V_draft) logits: the inference head (lm_head rows of the draft vocabulary)."""
    vocab = extract_model_from_parallel(drafter).draft_vocab
    weight = lm_head.weight if vocab is None else lm_head.weight.index_select(0, vocab)
    return F.linear(hidden, weight.to(hidden.dtype))


def to_draft_ids(token_ids: torch.Tensor, drafter: AdaFlashDrafter, vocab_size: int) -> torch.Tensor:
    """Target token ids -> indices into the draft vocabulary; ``IGNORE_INDEX`` where a token is outside it."""
    vocab = extract_model_from_parallel(drafter).draft_vocab
    if vocab is None:
        return token_ids
    to_draft = torch.full((vocab_size,), IGNORE_INDEX, dtype=torch.long, device=token_ids.device)
    to_draft[vocab] = torch.arange(len(vocab), device=token_ids.device)
    return torch.where(token_ids >= 0, to_draft[token_ids.clamp_min(0)], IGNORE_INDEX)


def to_target_ids(draft_ids: torch.Tensor, drafter: AdaFlashDrafter) -> torch.Tensor:
    vocab = extract_model_from_parallel(drafter).draft_vocab
    return draft_ids if vocab is None else vocab[draft_ids]


@dataclass
class BlockOutput:
    """Per-block results of one drafter forward over sampled anchors.

    loss: scalar weighted loss. predictions, labels: (b, A, K) drafter argmax and labels
    (``IGNORE_INDEX`` where none). Predictions exist where labels do.
    """

    loss: torch.Tensor
    predictions: torch.Tensor
    labels: torch.Tensor


def drafter_block_forward(
    drafter: AdaFlashDrafter,
    target: PreTrainedModel,
    batch: Batch,
    features: TargetFeatures,
    anchors: torch.Tensor,
    anchor_valid: torch.Tensor,
    weights: torch.Tensor,
    consistent_labels: bool,
    distill_weight: float = 0.0,
    mean_over_processes: Callable[[torch.Tensor], torch.Tensor] | None = None,
    reach_weighted: bool = False,
) -> BlockOutput:
    """Offline step: drafter forward over every block, lm_head only on labelled positions, weighted loss.

    ``drafter`` may be wrapped for distributed training (the forward must go through the wrapper so
    gradients synchronise). features from ``target_features``; anchors/anchor_valid (b, A); weights (K,) for
    block positions 1..K (K <= block_size - 1). Loss: CE on the target's argmax + distill_weight *
    KL(p_target || p_draft). With ``mean_over_processes`` (data-parallel training: a tensor's mean over the
    processes) each weighted sum is divided by the mean weight of the processes' rows instead of its own, so
    the mean of the processes' losses, and of their gradients, is those of the whole batch. With
    ``reach_weighted`` each position is weighted by the drafter's own probability of reaching it
    (:func:`.losses.reach_weights`) instead of ``weights`` (which then only sets K).
    """
    context, labels = features.context, features.labels
    block_size = extract_model_from_parallel(drafter).config.block_size
    num_positions = weights.shape[0]
    device = context.device
    input_ids = batch.input_ids.to(device)
    b, num_anchors = anchors.shape
    lm_head = target.get_output_embeddings()
    hidden = block_hidden_states(drafter, target.get_input_embeddings(), input_ids, context, anchors, num_positions)

    block_lab = block_labels(
        labels,
        batch.label_mask.to(device),
        anchors,
        anchor_valid,
        block_size,
        input_ids=input_ids if consistent_labels else None,
    )[:, :, :num_positions]  # (b, A, K)
    valid = block_lab != IGNORE_INDEX
    # Labels outside the draft vocabulary cannot be drafted and give no CE.
    logits = draft_logits(drafter, lm_head, hidden[valid])  # (n, V_draft): only labelled positions pay the lm_head
    labels_flat = to_draft_ids(block_lab[valid], drafter, lm_head.weight.shape[0])
    flat_weights = weights.to(device).expand(b, num_anchors, -1)[valid]  # (n,)
    ce = label_cross_entropy(logits, labels_flat)  # (n,): once, for the loss and for reach weights
    if reach_weighted:  # log p of each label is -CE; a label outside the draft vocabulary cannot be drafted
        block_lp = torch.zeros(block_lab.shape, dtype=torch.float32, device=device)
        block_lp[valid] = (-ce.detach()).masked_fill(labels_flat == IGNORE_INDEX, -math.inf)
        flat_weights = reach_weights(block_lp)[valid]
    ce_total = kl_total = None
    if mean_over_processes is not None:  # every process takes part, whether it has labels or not
        local = torch.stack([(flat_weights * (labels_flat != IGNORE_INDEX)).sum(), flat_weights.sum()])
        ce_total, kl_total = mean_over_processes(local).unbind()
    loss = (
        weighted_mean(ce, labels_flat, flat_weights, IGNORE_INDEX, ce_total)
        if bool((labels_flat != IGNORE_INDEX).any())
        else logits.sum() * 0
    )
    if distill_weight > 0:
        label_pos = anchors[:, :, None] + torch.arange(1, num_positions + 1, device=device)  # (b, A, K)
        rows = torch.arange(b, device=device)[:, None, None].expand_as(label_pos)
        target_logits = features.logits[rows[valid], label_pos[valid] - 1]  # (n, V): the logits behind each label
        vocab = extract_model_from_parallel(drafter).draft_vocab
        if vocab is not None:
            target_logits = target_logits[:, vocab]
        loss = loss + distill_weight * decayed_forward_kl(
            logits, target_logits, block_lab[valid], flat_weights, total=kl_total
        )
    predictions = torch.full_like(block_lab, IGNORE_INDEX)
    predictions[valid] = to_target_ids(logits.argmax(-1), drafter)
    return BlockOutput(loss, predictions, block_lab)


def acceptance_counts(
    predictions: torch.Tensor, labels: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Teacher-forced greedy acceptance of (b, A, K) blocks.

    Returns accepted (N,) leading matches per block that has a first label, hits (K,) and seen (K,)
    where seen_k counts blocks whose positions 1..k-1 all matched and position k has a label, and
    hits_k those of them that also match at k (so hits/seen = conditional acceptance a_k).
    """
    has_label = labels != IGNORE_INDEX
    match = (predictions == labels) & has_label  # (b, A, K)
    run = match.long().cumprod(-1)  # 1 while every position so far matched
    prefix = torch.cat([torch.ones_like(run[..., :1]), run[..., :-1]], dim=-1)  # matched 1..k-1
    seen = (prefix.bool() & has_label).flatten(0, 1).sum(0)  # (K,)
    hits = run.flatten(0, 1).sum(0)  # (K,)
    accepted = run.sum(-1)[has_label[..., 0]]  # (N,)
    return accepted, hits, seen
