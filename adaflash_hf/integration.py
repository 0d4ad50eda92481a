"""transformers integration: ``target.generate(assistant_model=drafter)`` and pipelines use AdaFlash.

``enable_adaflash(target)`` swaps the target's class for a one-off subclass with the same name that
overrides ``GenerationMixin._get_candidate_generator`` (private; the only place a candidate generator
is chosen, stable from 4.57 to 5.24): when the assistant is an :class:`AdaFlashDrafter`, it returns an
:class:`AdaFlashCandidateGenerator`; every other assistant, prompt lookup and
``speculation_type="dflash"`` keep their stock generators. transformers' assisted-decoding loop does
the verification (greedy or sampling, every logits processor, streamers, stopping criteria). Its
``generate`` refuses beam search with an AdaFlash drafter, which transformers would run without it.
"""

from __future__ import annotations

import itertools
import logging
import time
from typing import Any

import torch
from transformers import DynamicCache, GenerationConfig, PreTrainedModel
from transformers.generation.candidate_generator import CandidateGenerator

from ._compat import check_transformers_version
from .checks import check_pair, check_token_ids, is_adaflash_drafter
from .decoding.config import NONE, DraftingConfig
from .decoding.draft_head import DraftHead, top_probs_and_tokens
from .decoding.drafting_state import DraftingState, default_drafting_state
from .decoding.learning import learn_acceptance
from .decoding.outputs import RoundStats, SpeculativeStats
from .decoding.policy import GoodputVerifyLength, VerifyLengthPolicy, wants_drafts
from .decoding.proposers.drafter import DrafterBlock, context_features, draft_block
from .decoding.proposers.hybrid import HybridProposer
from .decoding.recording import RoundObserver
from .modeling_adaflash import AdaFlashDrafter

logger = logging.getLogger(__name__)

_REQUESTS = itertools.count()  # row ids of recorded generate() calls


class AdaFlashCandidateGenerator(CandidateGenerator):
    """Hybrid drafting inside transformers' assisted-decoding loop (no extra target pass).

    Each round it proposes the drafter's block, drafted from the hidden states of the previous
    verification, or a suffix match from the prompt, the output so far or earlier requests, whichever
    is expected to get more tokens accepted (:mod:`adaflash_hf.decoding.proposers`), or nothing (a
    plain step). transformers calls ``get_candidates`` with the last verification output
    (``requires_model_outputs``) and ``update_candidate_strategy`` after acceptance. Statistics of the
    run accumulate in ``self.stats`` (a :class:`SpeculativeStats`). An ``observer``
    (:class:`~.decoding.recording.RoundObserver`) sees every round from the verification output the
    next ``get_candidates`` receives, so the final round of a call is not recorded.
    """

    requires_model_outputs = True

    def __init__(
        self,
        target: PreTrainedModel,
        drafter: AdaFlashDrafter,
        generation_config: GenerationConfig,
        verify_policy: VerifyLengthPolicy | None = None,
        drafting: DraftingConfig | None = None,
        drafting_state: DraftingState | None = None,
        observer: RoundObserver | None = None,
    ):
        check_pair(target, drafter)
        state = drafting_state or default_drafting_state(target)
        self.drafting = drafting or state.config
        self.target, self.drafter = target, drafter
        self.use_drafter = self.drafting.drafter
        self.embed = target.get_input_embeddings()
        self.head = DraftHead(target.get_output_embeddings(), drafter.draft_vocab) if self.use_drafter else None
        self.layer_ids = drafter.config.target_layer_ids
        self.max_length = generation_config.max_length
        self.policy = verify_policy or state.policy
        if isinstance(self.policy, GoodputVerifyLength) and self.policy.cost_model is None:
            self.policy.cost_model = state.cost_model
        self.state = state
        self.sequence_drafter = _SequenceDrafter(self) if self.use_drafter else None
        self.proposer = HybridProposer(
            state, self.drafting, self.sequence_drafter, getattr(drafter, "adaflash_datastore", None)
        )
        self._candidates: list = []  # the last proposal's candidates, which the estimator learns from
        state.seed_acceptance(getattr(drafter, "adaflash_acceptance_prior", None))
        # Ask the target for just the context layers, unless the user wants every hidden state returned
        # (selecting layers then breaks generate's output bookkeeping).
        wants_all = generation_config.return_dict_in_generate and generation_config.output_hidden_states
        self.model_kwargs_overrides: dict[str, Any] = {}
        if self.use_drafter or wants_all:
            self.model_kwargs_overrides["output_hidden_states"] = True if wants_all else [i + 1 for i in self.layer_ids]
        self.cache = DynamicCache()
        self.stats = SpeculativeStats()
        self._cached_len = 0  # target tokens whose features are in the drafter cache
        self._waiting: list[torch.Tensor] = []  # features of later tokens, not yet read by the drafter
        self._known = 0  # tokens of the sequence already in the proposer's history
        self._pending: tuple | None = (
            None  # (drafts, source, draft_time, verify_start, drafter_seconds) of the open round
        )
        self.observer = observer
        self._row_id = ("generate", next(_REQUESTS))
        self._recorded = 0  # tokens of the sequence the observer has seen
        self._last_round = (0, NONE)  # (num_drafts, source) of the round the next get_candidates reports

    @torch.inference_mode()
    def get_candidates(
        self, input_ids, model_kwargs=None, model_outputs=None, is_first_iteration=False, n_last_matches=0, **kwargs
    ):
        if self.observer is not None:
            self.observer.before_round()
        # The first call precedes the target's prefill: propose nothing, let it compute hidden states.
        if is_first_iteration or model_outputs is None:
            self.proposer.add_row(0, input_ids[0].tolist())
            self._known = self._recorded = self._prompt_len = input_ids.shape[1]
            return input_ids, None
        start = time.perf_counter()
        seq_len = input_ids.shape[1]
        processed = seq_len - 1  # the newest token (bonus) is not yet in the target cache
        if self.use_drafter:
            # Features of the tokens the last forward added (prefill: the prompt; later: the accepted
            # tokens, first in the verification output) wait here until the drafter next runs.
            added = processed - self._cached_len - sum(c.shape[1] for c in self._waiting)
            self._waiting.append(context_features(model_outputs.hidden_states, self.layer_ids)[:, :added])
            if self.observer is not None:
                self._record(input_ids, self._waiting[-1][0], model_outputs.logits[0])
        mask = model_kwargs.get("attention_mask") if model_kwargs else None
        if mask is None:
            mask = torch.ones_like(input_ids)
        if self.use_drafter:
            self.sequence_drafter.round = (input_ids, mask, processed)
        if wants_drafts(self.policy, 1):
            proposal = self.proposer.propose([0])
        else:  # the policy holds plain steps: no look-ups, no drafter
            proposal = self.proposer.no_proposal([0])
        self._candidates = proposal.candidates
        block = proposal.block
        draft_hidden, drafter_seconds = (None, None) if block is None else (block.hidden, block.seconds)
        verify_len = (
            int(self.policy.verify_lens(proposal.rates, draft_hidden, proposal.sources)[0])
            if proposal.tokens.shape[1]
            else 1
        )
        num_drafts = min(verify_len - 1, int(proposal.lengths[0]), self.max_length - seq_len - 1)
        if num_drafts <= 0:
            self._pending = (0, NONE, time.perf_counter() - start, time.perf_counter(), drafter_seconds)
            return input_ids, None
        draft_tokens = proposal.tokens[:, :num_drafts].to(input_ids.device)  # (1, g)
        self._pending = (
            num_drafts,
            proposal.sources[0],
            time.perf_counter() - start,
            time.perf_counter(),
            drafter_seconds,
        )
        # Deterministic drafts are exact one-hot proposals: returning no logits makes transformers verify
        # by sampling from the target and matching, which is lossless at any temperature.
        return torch.cat([input_ids, draft_tokens], dim=1), None

    def _record(self, input_ids: torch.Tensor, features: torch.Tensor, logits: torch.Tensor) -> None:
        """Hand the observer the tokens the last target forward processed (prefill: the prompt)."""
        new = input_ids[0, self._recorded :].tolist()
        if self._recorded == self._prompt_len:
            self.observer.on_prefill(
                self._row_id, input_ids[0, : self._recorded].tolist(), features, logits[-1], new[0]
            )
        else:
            num_drafts, source = self._last_round
            self.observer.on_round(self._row_id, features, logits[: len(new)], new, num_drafts, source)
        self._recorded = input_ids.shape[1]

    def update_candidate_strategy(self, input_ids: torch.LongTensor, scores: torch.FloatTensor, num_matches: int):
        chunk = input_ids[0, self._known :].tolist()
        learn_acceptance(self.state, self._candidates, [chunk])
        self.proposer.extend_row(0, chunk)
        self._known = input_ids.shape[1]
        if self._pending is None:
            return
        num_drafts, source, draft_time, verify_start, drafter_seconds = self._pending
        self._last_round = (num_drafts, source if num_drafts else NONE)
        verify_time = time.perf_counter() - verify_start
        num_matches = min(int(num_matches), num_drafts)
        self.stats.add_round(RoundStats([0], [num_matches], [num_drafts + 1], draft_time, verify_time, [source]))
        self.policy.update(torch.tensor([num_matches]), torch.tensor([num_drafts + 1]), draft_time + verify_time)
        self.state.observe_round(num_drafts + 1, verify_time, drafter_seconds)
        self._pending = None

    def finish(self) -> None:
        """Hand the finished request to the global suffix index (called when the next request starts)."""
        if 0 in self.proposer.history:
            self.proposer.finish_row(0)

    def end_recording(self) -> None:
        """Tell the observer this call's sequence is complete (called when ``generate`` returns)."""
        if self.observer is not None:
            self.observer.on_finish(self._row_id)
            self.observer = None


class _SequenceDrafter:
    """The drafter of one sequence as a :class:`~.decoding.proposers.hybrid.HybridProposer` source: its cache and
    unread features live on the candidate generator; ``round`` holds this round's (input_ids, mask, processed)."""

    def __init__(self, generator: AdaFlashCandidateGenerator):
        self.generator = generator
        self.block_size = generator.drafter.config.block_size
        self.round: tuple | None = None

    def propose(self, row_ids, anchors, anchor_pos, max_len) -> DrafterBlock:
        gen = self.generator
        input_ids, mask, processed = self.round
        tick = time.perf_counter()
        context = torch.cat(gen._waiting, dim=1)
        positions = (mask.long().cumsum(-1) - 1).clamp_min(0)  # (1, seq_len)
        hidden = draft_block(
            gen.drafter,
            gen.embed,
            input_ids[:, -1],
            context,
            positions[:, gen._cached_len : processed],
            positions[:, -1],
            mask[:, :processed],
            gen.cache,
        )
        gen._cached_len, gen._waiting = processed, []
        tokens, top_probs, logits = top_probs_and_tokens(gen.head, hidden[:, 1:])
        return DrafterBlock(tokens, top_probs, gen.head.scorer(logits), logits, hidden, time.perf_counter() - tick)


def _generate(self, *args, **kwargs):
    # transformers quietly turns an assistant off for beam search (a logged warning); refuse instead.
    if is_adaflash_drafter(kwargs.get("assistant_model")):
        config = kwargs.get("generation_config") or self.generation_config
        num_beams = kwargs.get("num_beams", config.num_beams) or 1
        if num_beams > 1 and kwargs.get("speculation_type", config.speculation_type) != "dflash":
            raise ValueError(
                f"num_beams={num_beams} asks for beam search, which an AdaFlash drafter cannot speed up: speculative "
                "decoding verifies one sequence's drafts. Set num_beams=1 (greedy or sampling), or drop "
                "assistant_model."
            )
    try:
        return super(type(self), self).generate(*args, **kwargs)
    finally:
        generator = getattr(self, "adaflash_last_generator", None)
        if generator is not None:
            generator.end_recording()


def _get_candidate_generator(
    self,
    generation_config,
    input_ids,
    inputs_tensor,
    logits_processor,
    model_kwargs,
    assistant_model=None,
    target_tokenizer=None,
    assistant_tokenizer=None,
):
    if is_adaflash_drafter(assistant_model) and generation_config.speculation_type != "dflash":
        if input_ids.shape[0] > 1:
            raise ValueError(
                "transformers' assisted generation runs one sequence at a time, but got a batch of "
                f"{input_ids.shape[0]}. "
                "For batches use adaflash_hf.generate(target, drafter, input_ids, attention_mask, ...), which "
                "advances every row by its own accepted length."
            )
        check_token_ids(input_ids, self.get_input_embeddings().weight.shape[0])  # before the target's first forward
        previous = getattr(self, "adaflash_last_generator", None)
        if previous is not None:
            previous.finish()
        generator = AdaFlashCandidateGenerator(
            self,
            assistant_model,
            generation_config,
            getattr(self, "adaflash_verify_policy", None),
            getattr(self, "adaflash_drafting", None),
            observer=getattr(self, "adaflash_observer", None),
        )
        self.adaflash_last_generator = generator
        return generator
    return super(type(self), self)._get_candidate_generator(
        generation_config=generation_config,
        input_ids=input_ids,
        inputs_tensor=inputs_tensor,
        logits_processor=logits_processor,
        model_kwargs=model_kwargs,
        assistant_model=assistant_model,
        target_tokenizer=target_tokenizer,
        assistant_tokenizer=assistant_tokenizer,
    )


def enable_adaflash(
    target: PreTrainedModel, verify_policy: VerifyLengthPolicy | None = None, drafting: DraftingConfig | None = None
) -> PreTrainedModel:
    """Make ``target.generate(assistant_model=drafter)`` and pipelines use AdaFlash; returns ``target``.

    Idempotent. Only this object changes (its class becomes a same-named subclass), so other models
    and other assistants keep transformers' stock behaviour. ``verify_policy`` sets the verify length
    (default: :class:`GoodputVerifyLength`); ``drafting`` the draft sources (default: drafter block,
    suffix matches and the global index of earlier requests). After a call,
    ``target.adaflash_last_generator.stats`` holds the run's tau, accept rate, sources and timings.
    """
    check_transformers_version()
    if not isinstance(target, PreTrainedModel) or not hasattr(target, "_get_candidate_generator"):
        raise TypeError(f"enable_adaflash expects a transformers generative model, got {type(target).__name__}.")
    if not getattr(type(target), "_adaflash_enabled", False):
        cls = type(target)
        target.__class__ = type(
            cls.__name__,
            (cls,),
            {
                "generate": _generate,
                "_get_candidate_generator": _get_candidate_generator,
                "_adaflash_enabled": True,
                "__module__": cls.__module__,
                "__qualname__": cls.__qualname__,
            },
        )
    if verify_policy is not None:
        target.adaflash_verify_policy = verify_policy
    if drafting is not None:
        target.adaflash_drafting = drafting
    return target


def last_generation_stats(target: PreTrainedModel) -> SpeculativeStats:
    """Statistics of the latest ``target.generate(assistant_model=drafter)`` call."""
    generator = getattr(target, "adaflash_last_generator", None)
    if generator is None:
        raise RuntimeError(
            "no AdaFlash generation has run on this model yet: call enable_adaflash(target), then generate."
        )
    return generator.stats
