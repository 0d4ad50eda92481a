"""The batched speculative-decoding engine: any batch size, per-row (ragged) acceptance, lossless.

Cache layout. Target and drafter caches are rectangular (b, slots): every round appends the same
number of slots to every row, and ``slot_mask`` (b, slots) marks which slots hold accepted tokens.
A row that accepted fewer drafts than the best row keeps masked "holes"; its positions stay
contiguous because position ids are tracked per row, not derived from slot indices. Slots past the
best row's acceptance are cropped away, and a finished row is dropped from both caches, so finished
rows cost nothing. The drafter's context slots mirror the target's one for one: the hidden states
of the slots a verification added become the drafter's new context in the next round.

Round: propose (drafter block, suffix matches) -> choose verify lengths -> verify -> accept -> crop ->
update policy, acceptance estimates and streams.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable

import torch
from transformers import DynamicCache, GenerationConfig, PreTrainedModel

from .._compat import CACHE_KWARG
from ..checks import check_pair, check_prompt_batch, sampling_params_from
from ..modeling_adaflash import AdaFlashDrafter
from .cost import timer
from .outputs import RoundStats, SpeculativeGenerateOutput, SpeculativeStats
from .policy import GoodputVerifyLength, VerifyLengthPolicy
from .proposers import (
    NONE,
    DraftHead,
    DraftingConfig,
    DraftingState,
    HybridProposer,
    default_drafting_state,
    top_probs_and_tokens,
)
from .sampling import greedy_accept, logits_to_probs, rejection_accept, sample

logger = logging.getLogger(__name__)

TokenCallback = Callable[[int, list[int]], None]


def context_features(hidden_states: tuple[torch.Tensor, ...], layer_ids: list[int]) -> torch.Tensor:
    """Concatenate the selected target layers: hidden_states[i + 1] is layer i's output -> (b, T, n*H)."""
    return torch.cat([hidden_states[i + 1] for i in layer_ids], dim=-1)


def draft_block(drafter, embed, anchors, context, context_pos, anchor_pos, key_mask, cache) -> torch.Tensor:
    """One drafter pass over ``[anchor, MASK x (B-1)]`` per row; returns (b, B, H) hidden states.

    anchors (b,) newest tokens; context (b, s, n*H) target features not yet in the drafter cache, at
    positions context_pos (b, s); anchor_pos (b,) the anchors' positions; key_mask (b, cached + s)
    marks valid context slots. The block's keys/values are cropped back off ``cache`` afterwards.
    """
    block_size = drafter.config.block_size
    block_ids = torch.full((anchors.shape[0], block_size), drafter.config.mask_token_id, dtype=torch.long, device=anchors.device)
    block_ids[:, 0] = anchors
    block_pos = anchor_pos[:, None] + torch.arange(block_size, device=anchors.device)
    out = drafter(
        noise_embeds=embed(block_ids),
        context_hidden_states=context,
        position_ids=torch.cat([context_pos, block_pos], dim=1),
        attention_mask=torch.cat([key_mask, torch.ones_like(block_ids)], dim=1),
        cache=cache,
    )
    cache.crop(-block_size)  # keep the context, drop the block
    return out.last_hidden_state


class _Rows:
    """Per-row decoding state of the active rows (all tensors share the batch dimension)."""

    def __init__(self, slot_mask, next_pos, last_token, pending_hidden, pending_pos, ids):
        self.slot_mask = slot_mask  # (b, S) 1 where a target cache slot holds an accepted token
        self.next_pos = next_pos  # (b,) position of last_token
        self.last_token = last_token  # (b,) newest token, not yet seen by the target
        self.pending_hidden = pending_hidden  # (b, s, n*H) target features not yet in the drafter cache (None: no drafter)
        self.pending_pos = pending_pos  # (b, s) their positions
        self.ids = ids  # original batch indices

    def select(self, keep: torch.Tensor) -> None:
        for name in ("slot_mask", "next_pos", "last_token", "pending_hidden", "pending_pos"):
            value = getattr(self, name)
            if value is not None:
                setattr(self, name, value.index_select(0, keep))
        self.ids = [self.ids[i] for i in keep.tolist()]


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
            :class:`DraftingConfig`); each round every row takes the candidate with the most
            expected accepted tokens, or none.
        drafting_state: acceptance statistics and the global suffix index shared across calls
            (default: one per target model, :func:`drafting_state`).
        draft_sampling: with ``do_sample``, sample the drafter's drafts from its distribution and accept
            with min(1, p/q); otherwise drafts are deterministic (also lossless).
        generator: torch RNG for reproducible sampling.
        streamer: a transformers streamer (batch size 1), fed the prompt then accepted tokens.
        on_tokens: callback ``(row, token_ids)`` called with each row's newly accepted tokens.
        tokenizer: the target's tokenizer; when given, checked against the target's vocabulary.
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
    attention_mask = check_prompt_batch(input_ids, attention_mask, streamer)
    if config.max_new_tokens is None:  # as generate(): max_length bounds prompt + new tokens
        config.max_new_tokens = config.max_length - input_ids.shape[1]
    params = sampling_params_from(config)
    if drafter is not None:
        check_pair(target, drafter, tokenizer)
    state = drafting_state or default_drafting_state(target)
    drafting = drafting or state.config
    use_drafter = drafter is not None and drafting.drafter
    max_new_tokens = config.max_new_tokens
    eos_ids = set() if config.eos_token_id is None else set(torch.tensor(config.eos_token_id).flatten().tolist())
    pad_id = config.pad_token_id if config.pad_token_id is not None else min(eos_ids, default=0)
    policy = verify_policy or state.policy
    if isinstance(policy, GoodputVerifyLength) and policy.cost_model is None:
        policy.cost_model = state.cost_model
    layer_ids = drafter.config.target_layer_ids if use_drafter else []
    hidden_request = [i + 1 for i in layer_ids] if use_drafter else None
    embed = target.get_input_embeddings()
    head = DraftHead(target.get_output_embeddings(), drafter.draft_vocab) if use_drafter else None
    vocab_size = target.get_output_embeddings().weight.shape[0]
    proposer = HybridProposer(state, drafting, drafter.config.block_size if use_drafter else None, getattr(drafter, "adaflash_datastore", None))
    device = input_ids.device
    batch_size = input_ids.shape[0]
    stats = SpeculativeStats()
    new_tokens: list[list[int]] = [[] for _ in range(batch_size)]
    if streamer is not None:
        streamer.put(input_ids.cpu())

    def choose(logits: torch.Tensor) -> torch.Tensor:  # (b, V) -> (b,)
        return logits.max(-1).indices if not params.do_sample else sample(logits_to_probs(logits, params), generator)

    # 0. Prefill the target on the prompts; its first token is the first anchor.
    start = timer(device)
    target_cache, draft_cache = DynamicCache(), DynamicCache()
    position_ids = (attention_mask.long().cumsum(-1) - 1).clamp_min(0)
    out = target(
        input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
        output_hidden_states=hidden_request, logits_to_keep=1, use_cache=True, **{CACHE_KWARG: target_cache},
    )
    first = choose(out.logits[:, -1])
    rows = _Rows(
        slot_mask=attention_mask.long(),
        next_pos=position_ids[:, -1] + 1,
        last_token=first,
        pending_hidden=context_features(out.hidden_states, layer_ids) if use_drafter else None,
        pending_pos=position_ids,
        ids=list(range(batch_size)),
    )
    stats.prefill_time = timer(device) - start
    for row in range(batch_size):
        proposer.add_row(row, input_ids[row][attention_mask[row].bool()].tolist())
    done = emit(rows.ids, [[t] for t in first.tolist()], new_tokens, eos_ids, max_new_tokens, streamer, on_tokens, proposer)
    drop_finished(rows, done, target_cache, draft_cache)

    while rows.ids:
        # 1. Propose: the drafter's block (one pass over [anchor, MASK...] with the new target features
        #    as context) and each row's suffix matches; every row keeps its most promising candidate.
        start = timer(device)
        drafted: dict[str, torch.Tensor] = {}

        def run_drafter(drafted: dict = drafted) -> tuple[torch.Tensor, torch.Tensor]:
            tick = timer(device)
            drafted["hidden"] = draft_block(drafter, embed, rows.last_token, rows.pending_hidden, rows.pending_pos,
                                            rows.next_pos, rows.slot_mask, draft_cache)
            tokens, top_probs, drafted["logits"] = top_probs_and_tokens(head, drafted["hidden"][:, 1:])
            drafted["seconds"] = timer(device) - tick
            return tokens, top_probs

        proposal = proposer.propose(rows.ids, run_drafter if use_drafter else None)
        draft_hidden, draft_logits = drafted.get("hidden"), drafted.get("logits")
        budget = torch.tensor([max_new_tokens - len(new_tokens[i]) for i in rows.ids])
        verify_lens = policy.verify_lens(proposal.rates, draft_hidden).cpu().clamp(1, proposal.tokens.shape[1] + 1)
        num_drafts = torch.minimum(torch.minimum(verify_lens - 1, proposal.lengths), budget - 1).clamp_min(0)  # never past max_new_tokens
        g = int(num_drafts.max())
        draft_tokens = proposal.tokens[:, :g].to(device)  # (b, g)
        draft_probs = None
        if params.do_sample and draft_sampling and g:
            draft_tokens, draft_probs = sample_drafter_rows(proposal.sources, draft_tokens, draft_logits, head, params,
                                                            vocab_size, generator)
        num_drafts = num_drafts.to(device)
        draft_time = timer(device) - start

        # 2. Verify: one target pass over [anchor, drafts] for every row.
        start = timer(device)
        verify_ids = torch.cat([rows.last_token[:, None], draft_tokens], dim=1)  # (b, g + 1)
        verify_pos = rows.next_pos[:, None] + torch.arange(g + 1, device=device)
        out = target(
            input_ids=verify_ids, position_ids=verify_pos,
            attention_mask=torch.cat([rows.slot_mask, torch.ones_like(verify_ids)], dim=1),
            output_hidden_states=hidden_request, use_cache=True, **{CACHE_KWARG: target_cache},
        )

        # 3. Accept: the longest lossless prefix per row, plus one token from the target.
        if params.do_sample:
            accept_lengths, next_tokens = rejection_accept(
                draft_tokens, logits_to_probs(out.logits, params), num_drafts, draft_probs, generator
            )
        else:
            accept_lengths, next_tokens = greedy_accept(draft_tokens, out.logits, num_drafts)
        verify_time = timer(device) - start

        # 4. Crop: keep slots up to the best row's acceptance; the rest of each row becomes a hole.
        keep = int(accept_lengths.max()) + 1
        if keep < g + 1:
            target_cache.crop(keep - g - 1)
        kept = torch.arange(keep, device=device)[None]
        rows.slot_mask = torch.cat([rows.slot_mask, (kept <= accept_lengths[:, None]).long()], dim=1)
        if use_drafter:  # the drafter reads the new slots next time it runs (they wait while it is skipped)
            new_hidden = context_features(out.hidden_states, layer_ids)[:, :keep]
            if draft_hidden is not None:
                rows.pending_hidden, rows.pending_pos = new_hidden, verify_pos[:, :keep]
            else:
                rows.pending_hidden = torch.cat([rows.pending_hidden, new_hidden], dim=1)
                rows.pending_pos = torch.cat([rows.pending_pos, verify_pos[:, :keep]], dim=1)
        rows.next_pos = rows.next_pos + accept_lengths + 1
        rows.last_token = next_tokens

        # 5. Update policy, acceptance estimates, statistics and streams; retire finished rows.
        accepted_list, drafts_list = accept_lengths.tolist(), num_drafts.tolist()
        policy.update(accept_lengths.cpu(), num_drafts.cpu() + 1, verify_time)
        state.observe_round(len(accepted_list) * (g + 1), verify_time, drafted.get("seconds"))
        sources = [s if n else NONE for s, n in zip(proposal.sources, drafts_list)]
        stats.add_round(RoundStats(list(rows.ids), accepted_list, [n + 1 for n in drafts_list], draft_time, verify_time, sources))
        accepted = torch.cat([draft_tokens, next_tokens[:, None]], dim=1).tolist()
        chunks = [accepted[i][:n] + [t] for i, (n, t) in enumerate(zip(accepted_list, next_tokens.tolist()))]
        proposer.record(rows.ids, chunks)
        done = emit(rows.ids, chunks, new_tokens, eos_ids, max_new_tokens, streamer, on_tokens, proposer)
        drop_finished(rows, done, target_cache, draft_cache)

    if streamer is not None:
        streamer.end()
    longest = max(len(t) for t in new_tokens)
    tail = torch.full((batch_size, longest), pad_id, dtype=torch.long, device=device)
    for i, tokens in enumerate(new_tokens):
        tail[i, : len(tokens)] = torch.tensor(tokens, dtype=torch.long)
    return SpeculativeGenerateOutput(
        sequences=torch.cat([input_ids, tail], dim=1), num_new_tokens=[len(t) for t in new_tokens], stats=stats
    )


def sample_drafter_rows(sources, draft_tokens, draft_logits, head, params, vocab_size, generator):
    """Sampled drafts for the rows that took the drafter's block; one-hot q for suffix rows.

    Returns draft_tokens (b, g) and draft_probs (b, g, V) over the target vocabulary, so that
    rejection sampling with min(1, p/q) stays exact for every row.
    """
    g = draft_tokens.shape[1]
    draft_probs = torch.zeros(*draft_tokens.shape, vocab_size, device=draft_tokens.device)
    draft_probs.scatter_(-1, draft_tokens[..., None], 1.0)
    rows = [i for i, s in enumerate(sources) if s == "drafter"]
    if rows and draft_logits is not None:
        index = torch.tensor(rows, device=draft_tokens.device)
        q = head.to_target_probs(logits_to_probs(draft_logits[index, :g], params), vocab_size)
        draft_tokens = draft_tokens.clone()
        draft_tokens[index] = sample(q, generator)
        draft_probs[index] = q
    return draft_tokens, draft_probs


def emit(ids, chunks, new_tokens, eos_ids, max_new_tokens, streamer, on_tokens, proposer) -> list[bool]:
    """Append each row's accepted tokens, cut at EOS and max_new_tokens; return which rows are done."""
    done = []
    for row, chunk in zip(ids, chunks):
        room = max_new_tokens - len(new_tokens[row])
        chunk = chunk[:room]
        for j, token in enumerate(chunk):
            if token in eos_ids:
                chunk = chunk[: j + 1]
                break
        new_tokens[row].extend(chunk)
        finished = len(new_tokens[row]) >= max_new_tokens or (bool(chunk) and chunk[-1] in eos_ids)
        done.append(finished)
        proposer.extend_row(row, chunk)
        if finished:
            proposer.finish_row(row)
        if streamer is not None and chunk:
            streamer.put(torch.tensor(chunk))
        if on_tokens is not None and chunk:
            on_tokens(row, chunk)
    return done


def drop_finished(rows: _Rows, done: list[bool], target_cache: DynamicCache, draft_cache: DynamicCache) -> None:
    """Remove finished rows from the state and both caches, so they stop costing compute."""
    if not any(done):
        return
    keep = torch.tensor([i for i, d in enumerate(done) if not d], dtype=torch.long, device=rows.last_token.device)
    rows.select(keep)
    if len(keep):
        target_cache.batch_select_indices(keep)
        draft_cache.batch_select_indices(keep)
