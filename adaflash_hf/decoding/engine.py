"""Batched speculative generation: ``generate`` is a loop over :class:`~.state.SpeculativeBatch`.

Any batch size, per-row (ragged) acceptance, lossless. The round itself (propose, choose verify
lengths, verify, accept, crop) lives in :mod:`.state`, which the serving scheduler steps too.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable

import torch
from transformers import GenerationConfig, PreTrainedModel

from ..checks import check_pair, check_prompt_batch
from ..modeling_adaflash import AdaFlashDrafter
from .config import DraftingConfig
from .drafting_state import DraftingState
from .outputs import SpeculativeGenerateOutput, SpeculativeStats
from .policy import VerifyLengthPolicy
from .recording import RoundObserver
from .sampling import sampling_params_from
from .state import RowSpec, SpeculativeBatch

logger = logging.getLogger(__name__)

TokenCallback = Callable[[int, list[int]], None]


@torch.inference_mode()
def generate(
    target: PreTrainedModel,
    drafter: AdaFlashDrafter | None,
    input_ids: torch.LongTensor,
    attention_mask: torch.Tensor | None = None,
    *,
    verify_policy: VerifyLengthPolicy | None = None,
    drafting: DraftingConfig | None = None,
    drafting_state: DraftingState | None = None,
    draft_sampling: bool = False,
    generator: torch.Generator | None = None,
    streamer=None,
    on_tokens: TokenCallback | None = None,
    tokenizer=None,
    observer: RoundObserver | None = None,
    generation_config: GenerationConfig | None = None,
    **generation_kwargs,
) -> SpeculativeGenerateOutput:
    """Speculative generation for a batch of left-padded prompts.

    Args:
        target: the causal LM whose output distribution is reproduced exactly.
        drafter: an :class:`AdaFlashDrafter` built for ``target``, or None to draft from suffix
            matches only.
        input_ids: (b, L) left-padded prompt ids; attention_mask (b, L) is required when b > 1.
        verify_policy: chooses verify lengths per round (default: :class:`GoodputVerifyLength`, which
            maximises expected tokens per second with this machine's measured verify cost).
        drafting: which draft sources each row may use per round (default: all of them, see
            :class:`DraftingConfig`); each round every row verifies a draft tree of its candidates'
            likeliest tokens (:mod:`.draft_tree`), or with ``tree_nodes=0`` the single candidate with the most
            expected accepted tokens, or nothing.
        drafting_state: acceptance statistics and the global suffix index shared across calls
            (default: one per target model, :func:`drafting_state`).
        draft_sampling: with ``do_sample``, sample the drafter's drafts from its distribution and accept
            with min(1, p/q); otherwise drafts are deterministic (also lossless).
        generator: torch RNG for reproducible sampling.
        streamer: a transformers streamer (batch size 1), fed the prompt then accepted tokens.
        on_tokens: callback ``(row, token_ids)`` called with each row's newly accepted tokens.
        tokenizer: the target's tokenizer; when given, checked against the target's vocabulary.
        observer: records trajectories and swaps adapters between rounds (e.g. ``AdaFlashOPD.observer``);
            default: the one attached to ``target`` by ``AdaFlashOPD.attach``, if any.
        generation_config / **generation_kwargs: as for ``model.generate``: ``max_new_tokens``,
            ``do_sample``, ``temperature``, ``top_k``, ``top_p``, ``eos_token_id`` (an id or a list of
            stop ids), ``pad_token_id``; defaults come from ``target.generation_config``.

    Returns:
        :class:`SpeculativeGenerateOutput` with ``sequences`` and per-round ``stats``.
    """
    config = copy.deepcopy(generation_config or target.generation_config)
    unused = config.update(**generation_kwargs)
    if unused:
        raise TypeError(
            f"adaflash_hf.generate got unknown arguments {sorted(unused)}; it takes GenerationConfig fields "
            "(max_new_tokens, do_sample, temperature, top_k, top_p, eos_token_id, pad_token_id)."
        )
    attention_mask = check_prompt_batch(
        input_ids, attention_mask, streamer, vocab_size=target.get_input_embeddings().weight.shape[0]
    )
    if config.max_new_tokens is None:  # as generate(): max_length bounds prompt + new tokens
        config.max_new_tokens = config.max_length - input_ids.shape[1]
    params = sampling_params_from(config)
    if drafter is not None:
        check_pair(target, drafter, tokenizer)
    eos_ids = (
        frozenset() if config.eos_token_id is None else frozenset(torch.tensor(config.eos_token_id).flatten().tolist())
    )
    pad_id = config.pad_token_id if config.pad_token_id is not None else min(eos_ids, default=0)
    stats = SpeculativeStats()
    batch = SpeculativeBatch(
        target,
        drafter,
        drafting=drafting,
        drafting_state=drafting_state,
        verify_policy=verify_policy,
        draft_sampling=draft_sampling,
        generator=generator,
        on_round=stats.add_round,
        observer=observer or getattr(target, "adaflash_observer", None),
    )
    batch_size = input_ids.shape[0]
    new_tokens: list[list[int]] = [[] for _ in range(batch_size)]
    if streamer is not None:
        streamer.put(input_ids.cpu())
    updates = batch.add_rows(
        [
            RowSpec(row, input_ids[row][attention_mask[row].bool()].tolist(), config.max_new_tokens, params, eos_ids)
            for row in range(batch_size)
        ]
    )
    stats.prefill_time = batch.prefill_time
    while True:
        for update in updates:
            if not update.tokens:
                continue
            new_tokens[update.row_id].extend(update.tokens)
            if streamer is not None:
                streamer.put(torch.tensor(update.tokens))
            if on_tokens is not None:
                on_tokens(update.row_id, update.tokens)
        if not len(batch):
            break
        updates = batch.step()
    if streamer is not None:
        streamer.end()
    longest = max(len(t) for t in new_tokens)
    tail = torch.full((batch_size, longest), pad_id, dtype=torch.long, device=input_ids.device)
    for i, tokens in enumerate(new_tokens):
        tail[i, : len(tokens)] = torch.tensor(tokens, dtype=torch.long)
    return SpeculativeGenerateOutput(
        sequences=torch.cat([input_ids, tail], dim=1), num_new_tokens=[len(t) for t in new_tokens], stats=stats
    )
