"""Input validation shared by every entry point: clear errors before any tensor reaches torch.

Each check names the offending values and says what to do.
"""

from __future__ import annotations

import torch
from transformers import PreTrainedModel

from .configuration_adaflash import AdaFlashDrafterConfig


def is_adaflash_drafter(model) -> bool:
    """True for AdaFlash drafters, including copies loaded as Hub remote code (a different class object)."""
    return getattr(getattr(model, "config", None), "model_type", None) == AdaFlashDrafterConfig.model_type


def check_device(device: str | torch.device) -> torch.device:
    """``device`` as a ``torch.device``, refused with a clear error when it is malformed or this machine lacks it."""
    try:
        device = torch.device(device)
    except (RuntimeError, TypeError) as error:
        raise ValueError(
            f"device {device!r} is not a device torch knows ({error}); use e.g. 'cpu', 'cuda' or 'cuda:1'."
        ) from None
    if device.type == "cuda" and (not torch.cuda.is_available() or (device.index or 0) >= torch.cuda.device_count()):
        found = (
            f"{torch.cuda.device_count()} CUDA device(s)"
            if torch.cuda.is_available()
            else "no CUDA device this torch build can use"
        )
        raise ValueError(
            f"device {str(device)!r} is not available: this machine has {found}. Use 'cpu', or install a "
            "CUDA build of torch on a machine with a GPU."
        )
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise ValueError("device 'mps' is not available on this machine; use 'cpu'.")
    return device


def pair_problems(drafter_config, text_config, vocab_rows: int) -> list[str]:
    """Why a drafter of ``drafter_config`` does not fit a target whose text config is ``text_config`` and whose
    embedding has ``vocab_rows`` rows (empty when it fits); read from configs alone, so no weights need loading."""
    dc, text = drafter_config, text_config
    problems = []
    if dc.hidden_size != text.hidden_size:
        problems.append(f"hidden size: drafter {dc.hidden_size} vs target {text.hidden_size}")
    if dc.vocab_size != vocab_rows:
        problems.append(f"vocabulary: drafter {dc.vocab_size} vs target {vocab_rows} embedding rows")
    bad_layers = [i for i in dc.target_layer_ids if not 0 <= i < text.num_hidden_layers]
    if bad_layers:
        problems.append(f"target_layer_ids {bad_layers} out of range for a target with {text.num_hidden_layers} layers")
    if not 0 <= dc.mask_token_id < vocab_rows:
        problems.append(f"mask_token_id {dc.mask_token_id} outside the target vocabulary [0, {vocab_rows})")
    if dc.block_size < 2:
        problems.append(f"block_size {dc.block_size} < 2")
    return problems


def check_pair(target: PreTrainedModel, drafter, tokenizer=None) -> None:
    """Raise ValueError when ``drafter`` was not built for ``target`` (or ``tokenizer``)."""
    if not is_adaflash_drafter(drafter):
        raise TypeError(
            f"assistant/drafter is a {type(drafter).__name__}, not an AdaFlashDrafter. Load one with "
            "AdaFlashDrafter.from_pretrained(path) or build one with AdaFlashDrafter.from_target(target)."
        )
    vocab_rows = target.get_input_embeddings().weight.shape[0]
    problems = pair_problems(drafter.config, target.config.get_text_config(), vocab_rows)
    if drafter.dtype != target.dtype or drafter.device != target.device:
        problems.append(
            f"drafter is {drafter.dtype} on {drafter.device} but the target is {target.dtype} on {target.device} "
            "(move it with drafter.to(device=target.device, dtype=target.dtype))"
        )
    if tokenizer is not None and len(tokenizer) > vocab_rows:
        problems.append(f"tokenizer has {len(tokenizer)} tokens but the target embeds only {vocab_rows}")
    if problems:
        raise ValueError(
            "This drafter does not fit this target: " + "; ".join(problems) + ". Use a drafter trained for "
            "this target, or build a fresh one with AdaFlashDrafter.from_target(target)."
        )


def check_prompt_batch(
    input_ids: torch.Tensor, attention_mask: torch.Tensor | None, streamer=None, vocab_size: int | None = None
) -> torch.Tensor:
    """Validate a batch of prompts; return the attention mask (all ones for a single row without one).

    With ``vocab_size`` (the target's embedding rows), token ids outside ``[0, vocab_size)`` are refused.
    """
    if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2:
        raise ValueError(
            f"input_ids must be a 2-D LongTensor (batch, length); got {type(input_ids).__name__}"
            f"{'' if not isinstance(input_ids, torch.Tensor) else ' of shape ' + str(tuple(input_ids.shape))}. "
            "Tokenize with return_tensors='pt'."
        )
    if input_ids.dtype.is_floating_point or input_ids.dtype.is_complex or input_ids.dtype == torch.bool:
        raise ValueError(
            f"input_ids must hold integer token ids (a LongTensor), got {input_ids.dtype}. "
            "Tokenize with return_tensors='pt'."
        )
    batch_size, length = input_ids.shape
    if batch_size == 0 or length == 0:
        raise ValueError(
            f"empty prompt batch (input_ids shape {tuple(input_ids.shape)}): give at least one token per prompt."
        )
    if vocab_size is not None:
        check_token_ids(input_ids, vocab_size)
    if attention_mask is None:
        if batch_size > 1:
            raise ValueError(
                f"a batch of {batch_size} prompts needs an attention_mask that marks left padding: tokenize with "
                "tokenizer(prompts, padding=True, return_tensors='pt') and padding_side='left'."
            )
        return torch.ones_like(input_ids)
    if attention_mask.shape != input_ids.shape:
        raise ValueError(
            f"attention_mask shape {tuple(attention_mask.shape)} != input_ids shape {tuple(input_ids.shape)}."
        )
    empty = (attention_mask.sum(-1) == 0).nonzero().flatten().tolist()
    if empty:
        raise ValueError(
            f"prompt rows {empty} are empty (attention_mask all zero): give at least one token per prompt."
        )
    if bool((attention_mask[:, -1] == 0).any()):
        raise ValueError(
            "the batch is right-padded (attention_mask ends in 0): decoder-only generation needs left padding; "
            "set tokenizer.padding_side = 'left'."
        )
    if streamer is not None and batch_size > 1:
        raise ValueError("a streamer takes one sequence; for batches use on_tokens=callback(row, token_ids).")
    return attention_mask


def check_token_ids(input_ids: torch.Tensor, vocab_size: int) -> None:
    """Raise a ValueError naming the first token id of ``input_ids`` (b, L) outside ``[0, vocab_size)``."""
    bad = (input_ids < 0) | (input_ids >= vocab_size)
    if bool(bad.any()):
        row, position = bad.nonzero()[0].tolist()
        count = int(bad.sum())
        raise ValueError(
            f"token id {int(input_ids[row, position])} (row {row}, position {position}"
            f"{f'; {count} such ids in all' if count > 1 else ''}) is outside the target's vocabulary of {vocab_size} "
            f"ids [0, {vocab_size}): tokenize with the target's own tokenizer, and pad with its pad_token_id."
        )


def check_verify_len(verify_len: int, drafter, drafting) -> None:
    """Raise a ValueError when a fixed ``verify_len`` exceeds what any proposal can fill.

    ``verify_len`` counts the anchor plus the drafts verified, so it is at most 1 + the longest
    proposal: the drafter's block minus the anchor, or ``drafting.max_suffix_tokens`` for suffix
    matches (the suffix, global and datastore sources), whichever of the enabled sources is longer.
    """
    block = drafter.config.block_size if drafter is not None and drafting.drafter else None
    matches = (
        drafting.suffix
        or drafting.global_index
        or (drafting.datastore and getattr(drafter, "adaflash_datastore", None) is not None)
    )
    longest = max((block or 1) - 1, drafting.max_suffix_tokens if matches else 0)
    if not 1 <= verify_len <= longest + 1:
        parts = ([f"the drafter's block of {block} gives {block - 1}"] if block else []) + (
            [f"suffix matches give up to {drafting.max_suffix_tokens}"] if matches else []
        )
        raise ValueError(
            f"verify_len={verify_len}: a round verifies the anchor plus at most {longest} drafts ({'; '.join(parts)}), "
            f"so choose 1..{longest + 1}, or leave it unset for the goodput policy."
        )
