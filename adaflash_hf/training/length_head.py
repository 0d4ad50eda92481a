"""Training the adaptive length head on the engine's own acceptance records.

Records. The real engine (:func:`adaflash_hf.generate`) decodes training prompts with the drafter as
the only draft source and a policy that verifies the whole block every round
(:class:`RecordingVerifyLength`), so labels are censored only by ``max_new_tokens``. Every round and
row yields the drafter's hidden states for the block (what the head reads), the drafter's top-1
probabilities and the engine estimator's rates (what the existing policy reads, and the head's
prior), the number of drafts verified and the number accepted. Records are cached as safetensors
shards keyed by what produced them; a rerun reuses finished shards.

Loss. A discrete survival model: draft k is *at risk* when drafts < k were accepted and k was
verified, i.e. k <= min(accepted + 1, verified); it is a success when k <= accepted. Binary
cross-entropy over the at-risk positions only (:func:`survival_loss`); positions after the first
rejection or past the verified length carry no label.

Evaluation on records of held-out (eval split) prompts, against the engine's
:class:`~adaflash_hf.decoding.proposers.AcceptanceEstimator` as the policy received it, that
estimator's features refit on the training records, and per-position constants: per-position log-loss
and Brier score, and the error of the expected accepted length.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from tqdm.auto import tqdm
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from ..configuration_length_head import AdaFlashLengthHeadConfig
from ..decoding.config import DraftingConfig
from ..decoding.draft_head import DraftHead, top_probs_and_tokens
from ..decoding.drafting_state import DraftingState
from ..decoding.policy import FixedVerifyLength
from ..decoding.proposers.drafter import drafter_feature
from ..model_card import length_head_card
from ..modeling_length_head import AdaFlashLengthHead
from .configs import TrainLengthHeadConfig

logger = logging.getLogger(__name__)

HEAD_FOLDER_SUFFIX = "-length-head"  # bundled/<preset>-length-head/ sits beside bundled/<preset>/
SHARD_PROMPTS = 32  # prompts per cached record shard


# ---------------------------------------------------------------------------------------------
# Records
# ---------------------------------------------------------------------------------------------

@dataclass
class AcceptanceRecords:
    """One row per (request, round) in which the drafter's block was verified.

    draft_hidden_states (N, B, H) the drafter's block states; top_probs (N, B-1) its top-1 probability
    per draft; rates (N, B-1) the engine estimator's conditional acceptance estimates the policy
    received; accept_lengths (N,) accepted drafts; num_verified (N,) drafts verified; shards (N,) the
    shard (group of whole prompts) a row came from, for analyses by prompt group.
    """

    draft_hidden_states: torch.Tensor
    top_probs: torch.Tensor
    rates: torch.Tensor
    accept_lengths: torch.Tensor
    num_verified: torch.Tensor
    shards: torch.Tensor

    def __len__(self) -> int:
        return self.accept_lengths.shape[0]

    def select(self, index: torch.Tensor) -> AcceptanceRecords:
        return AcceptanceRecords(**{k: v[index] for k, v in asdict_tensors(self).items()})

    @classmethod
    def cat(cls, parts: list[AcceptanceRecords]) -> AcceptanceRecords:
        return cls(**{k: torch.cat([asdict_tensors(p)[k] for p in parts]) for k in asdict_tensors(parts[0])})

    def save(self, path: Path) -> None:
        tmp = path.with_suffix(".tmp")
        save_file({k: v.contiguous() for k, v in asdict_tensors(self).items()}, str(tmp))
        tmp.replace(path)

    @classmethod
    def load(cls, path: Path) -> AcceptanceRecords:
        return cls(**load_file(str(path)))


def asdict_tensors(records: AcceptanceRecords) -> dict[str, torch.Tensor]:
    return {name: getattr(records, name) for name in records.__dataclass_fields__}


class RecordingVerifyLength:
    """Verifies every proposal whole (labels uncensored) and keeps what a length policy saw each round.

    The engine calls ``verify_lens`` then ``update`` once per round with the same rows in the same
    order, so the pair is one record per row. Rounds without the drafter's block are skipped.
    """

    def __init__(self):
        self.policy = FixedVerifyLength()
        self.rounds: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]] = []
        self._seen: tuple[torch.Tensor, torch.Tensor | None] | None = None

    def verify_lens(self, rates: torch.Tensor, draft_hidden_states: torch.Tensor | None, sources: list[str] | None = None) -> torch.Tensor:
        self._seen = (rates, draft_hidden_states)
        return self.policy.verify_lens(rates, draft_hidden_states, sources)

    def update(self, accept_lengths: torch.Tensor, verify_lens: torch.Tensor, seconds: float,
               proposed: bool | None = None) -> None:
        rates, hidden = self._seen
        if hidden is not None:
            num_drafts = hidden.shape[1] - 1
            self.rounds.append((hidden.detach().cpu(), rates[:, :num_drafts].float().cpu(), accept_lengths.cpu().long(),
                                verify_lens.cpu().long() - 1))

    def pop_records(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """(hidden (N, B, H), rates (N, B-1), accept_lengths (N,), num_verified (N,)) of the rounds seen, cleared."""
        hidden, rates, accepted, verified = (torch.cat(parts) for parts in zip(*self.rounds))
        self.rounds = []
        keep = verified > 0  # a row with one token of budget left verifies nothing: no label
        return hidden[keep], rates[keep], accepted[keep], verified[keep]


class AlwaysDraftState(DraftingState):
    """A :class:`DraftingState` whose drafter runs every round (the default one skips it when it does not seem
    to pay), so every round of every row yields a record."""

    def __init__(self):
        super().__init__(DraftingConfig.only("drafter"))

    def drafter_pays(self, best_other, width) -> bool:
        return True


def _estimator_counts(state: DraftingState) -> list:
    return [[source, list(feature), state.estimator.hits.get((source, feature), 0.0), seen]
            for (source, feature), seen in state.estimator.seen.items()]


def _restore_estimator(state: DraftingState, counts: list) -> None:
    for source, feature, hits, seen in counts:
        state.estimator.hits[(source, tuple(feature))] = hits
        state.estimator.seen[(source, tuple(feature))] = seen


def _fingerprint(drafter: PreTrainedModel) -> str:
    """Identifies the drafter's weights cheaply (its context projection), so a new drafter gets new records."""
    return hashlib.sha256(drafter.fc.weight.detach().float().cpu().numpy().tobytes()).hexdigest()[:16]


@torch.no_grad()
def drafter_top_probs(target: PreTrainedModel, drafter: PreTrainedModel, hidden: torch.Tensor, chunk: int = 128) -> torch.Tensor:
    """The drafter's top-1 probability of each draft (N, B-1), from its block states (N, B, H), as the engine computes it."""
    head = DraftHead(target.get_output_embeddings(), drafter.draft_vocab)
    parts = [top_probs_and_tokens(head, hidden[i : i + chunk, 1:].to(target.device, target.dtype))[1].float().cpu()
             for i in range(0, hidden.shape[0], chunk)]
    return torch.cat(parts)


def collect_records(
    target: PreTrainedModel,
    drafter: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    prompts: list[str],
    cache_dir: str | Path,
    state: DraftingState,
    *,
    key: str,
    max_new_tokens: int = 96,
    batch_size: int = 8,
    shard_size: int = SHARD_PROMPTS,
    max_prompt_tokens: int = 512,
    max_minutes: float | None = None,
    desc: str = "record acceptance",
) -> AcceptanceRecords | None:
    """Decode ``prompts`` with the real engine (drafter only, whole blocks verified) and return its records.

    Shards of ``shard_size`` prompts are cached under ``cache_dir/<hash of key and prompts>/``; a rerun
    loads them, and the estimator counts saved after each shard continue where they stopped.
    ``max_minutes`` stops after the shard that crosses it. None when nothing was recorded.
    """
    from ..decoding.engine import generate
    from ..prompting import chat_prompt_ids
    from .data import _left_pad

    digest = hashlib.sha256("\0".join([key, *prompts]).encode()).hexdigest()[:16]
    cache_dir = Path(cache_dir) / digest
    cache_dir.mkdir(parents=True, exist_ok=True)
    meta_path = cache_dir / "meta.json"
    meta = json.loads(meta_path.read_text()) if meta_path.exists() else {"key": key, "num_prompts": len(prompts), "shards": {}}
    encoded = [chat_prompt_ids(tokenizer, p) for p in prompts]
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    parts, start_time = [], time.perf_counter()
    num_shards = (len(prompts) + shard_size - 1) // shard_size
    bar = tqdm(total=len(prompts), desc=desc, unit="prompt")
    for shard in range(num_shards):
        path = cache_dir / f"shard_{shard:05d}.safetensors"
        indices = range(shard * shard_size, min((shard + 1) * shard_size, len(prompts)))
        if path.exists():
            parts.append(AcceptanceRecords.load(path))
            _restore_estimator(state, meta["shards"][path.name]["estimator"])  # the counts after this shard
            bar.update(len(indices))
            continue
        if max_minutes is not None and (time.perf_counter() - start_time) / 60 >= max_minutes:
            break
        shard_start = time.perf_counter()
        recorder = RecordingVerifyLength()
        kept = sorted((i for i in indices if len(encoded[i]) <= max_prompt_tokens), key=lambda i: len(encoded[i]))
        for lo in range(0, len(kept), batch_size):
            input_ids, attention_mask = _left_pad([encoded[i] for i in kept[lo : lo + batch_size]], pad_id)
            generate(target, drafter, input_ids.to(target.device), attention_mask.to(target.device), max_new_tokens=max_new_tokens,
                     do_sample=False, pad_token_id=pad_id, verify_policy=recorder, drafting=state.config, drafting_state=state)
            bar.update(min(batch_size, len(kept) - lo))
        bar.update(len(indices) - len(kept))
        if not recorder.rounds:
            continue
        hidden, rates, accepted, verified = recorder.pop_records()
        records = AcceptanceRecords(hidden.to(torch.bfloat16), drafter_top_probs(target, drafter, hidden), rates, accepted,
                                    verified, torch.full_like(accepted, shard))
        meta["shards"][path.name] = {"prompts": len(kept), "records": len(records), "seconds": round(time.perf_counter() - shard_start, 1),
                                     "estimator": _estimator_counts(state)}
        meta_path.write_text(json.dumps(meta, indent=1))  # before the shard: a shard on disk always has its entry
        records.save(path)
        parts.append(records)
    bar.close()
    return AcceptanceRecords.cat(parts) if parts else None


# ---------------------------------------------------------------------------------------------
# Loss and calibration
# ---------------------------------------------------------------------------------------------

def survival_targets(accept_lengths: torch.Tensor, num_verified: torch.Tensor, num_drafts: int) -> tuple[torch.Tensor, torch.Tensor]:
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
    """E[accepted drafts] (N,) from conditional rates (N, m): sum_k prod_{j<=k} a_j, over the first num_verified drafts."""
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
        bins = torch.tensor([[drafter_feature(k, float(p))[1] if use_top_prob else 0 for k, p in enumerate(row)]
                             for row in records.top_probs.tolist()])
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
    """The head's conditional-acceptance logits (N, B-1) for every record, from its block states and the engine's rates."""
    return torch.cat([head(records.draft_hidden_states[i : i + chunk].float(), records.rates[i : i + chunk]).logits.float()
                      for i in range(0, len(records), chunk)])


def fit_head(head: AdaFlashLengthHead, train: AcceptanceRecords, validation: AcceptanceRecords, epochs: int, lr: float,
             weight_decay: float, batch_size: int, seed: int) -> list[dict]:
    """AdamW on :func:`survival_loss` with a cosine decay to 0; keeps the epoch with the lowest validation loss.

    The decay matters: at a constant lr the held-out loss of consecutive epochs swung by +-0.01, as much
    as the head gains over the engine's estimator (``results/experiments.md``).
    """
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.AdamW(head.parameters(), lr=lr, weight_decay=weight_decay)
    total_steps = epochs * math.ceil(len(train) / batch_size)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 0.5 * (1 + math.cos(math.pi * step / total_steps)))
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
        val_loss = float(survival_loss(predict_logits(head, validation), validation.accept_lengths, validation.num_verified))
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


# ---------------------------------------------------------------------------------------------
# The command
# ---------------------------------------------------------------------------------------------

def train_length_head(config: TrainLengthHeadConfig, target: PreTrainedModel | None = None,
                      tokenizer: PreTrainedTokenizerBase | None = None, drafter: PreTrainedModel | None = None) -> dict:
    """Record, fit and evaluate a length head for ``config.drafter``; save it to ``output_dir/length_head``.

    ``target``/``tokenizer``/``drafter`` may be passed already loaded (tests use tiny random models).
    Returns the summary also written to ``length_head/training_summary.json``.
    """
    from ..data import load_prompts

    wall_start = time.perf_counter()
    if config.num_threads is not None:
        torch.set_num_threads(config.num_threads)
    torch.manual_seed(config.seed)
    output_dir = Path(config.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)

    # 1. Target and drafter.
    if target is None or tokenizer is None:
        from ..targets import load_target

        target, tokenizer = load_target(config.target, dtype=config.target_dtype)
    if drafter is None:
        from ..drafters import load_drafter

        drafter = load_drafter(config.drafter, target, target_name=config.target, datastore=False)
    drafter = drafter.eval()

    # 2. Records: training prompts first, then held-out prompts with the estimator the training prompts warmed up.
    record_start = time.perf_counter()
    state = AlwaysDraftState()
    key = json.dumps([config.target, str(target.dtype), _fingerprint(drafter), config.max_new_tokens])
    records_dir = Path(config.records_dir) if config.records_dir is not None else output_dir / "records"
    common = dict(key=key, max_new_tokens=config.max_new_tokens, batch_size=config.batch_size)
    train_prompts = load_prompts(config.train_domains, split="train", limit_per_domain=config.train_prompts_per_domain, seed=config.seed)
    eval_prompts = load_prompts(config.train_domains, split="eval", limit_per_domain=config.eval_prompts_per_domain)
    train = collect_records(target, drafter, tokenizer, list(train_prompts["prompt"]), records_dir / "train", state,
                            max_minutes=config.max_record_minutes, desc="record (train prompts)", **common)
    held_out = collect_records(target, drafter, tokenizer, list(eval_prompts["prompt"]), records_dir / "eval", state,
                               desc="record (held-out prompts)", **common)
    if train is None or held_out is None:
        raise ValueError("no acceptance records: the prompts produced no verified drafter blocks (all too long, or "
                         "max_new_tokens too small). Use more prompts or a larger --max-new-tokens.")
    record_minutes = (time.perf_counter() - record_start) / 60

    # 3. Fit, picking the epoch on held-back training records (the held-out prompts stay unseen).
    if len(train) < 2:
        raise ValueError(f"{len(train)} training record(s): too few to fit and validate a head. Use more prompts.")
    order = torch.randperm(len(train), generator=torch.Generator().manual_seed(config.seed))
    num_val = min(len(train) - 1, max(1, round(len(train) * config.validation_fraction)))
    fit, validation = train.select(order[num_val:]), train.select(order[:num_val])
    head = AdaFlashLengthHead(AdaFlashLengthHeadConfig(
        hidden_size=drafter.config.hidden_size, block_size=drafter.config.block_size, head_size=config.head_size,
        drafter=config.drafter if config.drafter != "auto" else f"bundled:{config.target}"))
    fit_start = time.perf_counter()
    history = fit_head(head, fit, validation, config.epochs, config.lr, config.weight_decay, config.train_batch_size, config.seed)
    fit_minutes = (time.perf_counter() - fit_start) / 60

    # 4. Held-out calibration: the head against the engine's estimator and its refit feature table.
    head.eval()
    truth = (held_out.accept_lengths, held_out.num_verified)
    evaluation = {
        "length_head": calibration(torch.sigmoid(predict_logits(head, held_out)), *truth),
        "engine_estimator": calibration(held_out.rates, *truth),
        "estimator_features_refit": calibration(table_rates(train, held_out), *truth),
        "position_only": calibration(table_rates(train, held_out, use_top_prob=False), *truth),
    }
    for name, result in evaluation.items():
        logger.info("held-out %-24s log-loss %.4f  Brier %.4f  length MAE %.3f  bias %+.3f", name, result["log_loss"],
                    result["brier"], result["length_mae"], result["length_bias"])
    if evaluation["length_head"]["log_loss"] >= evaluation["engine_estimator"]["log_loss"]:
        logger.warning("the length head does not beat the engine's estimator on held-out log-loss (%.4f vs %.4f)",
                       evaluation["length_head"]["log_loss"], evaluation["engine_estimator"]["log_loss"])

    # 5. Save the head, its summary and model card.
    head_dir = output_dir / "length_head"
    head.to(torch.bfloat16 if config.head_dtype == "bf16" else torch.float32).save_pretrained(head_dir)
    summary = {
        "recipe": asdict(config),
        "records": {"train": len(fit), "validation": len(validation), "held_out": len(held_out),
                    "train_prompts": min(len(train_prompts), (int(train.shards.max()) + 1) * SHARD_PROMPTS),
                    "held_out_prompts": len(eval_prompts)},
        "record_minutes": record_minutes, "fit_minutes": fit_minutes,
        "wall_minutes": (time.perf_counter() - wall_start) / 60,
        "history": history, "held_out": evaluation,
        "head_seconds_batch1": time_head(head.float(), 1),
        "drafter_seconds_ema": state.drafter_cost(config.batch_size),  # the engine's measured drafter pass at --batch-size rows
        "head_parameters": sum(p.numel() for p in head.parameters()),
    }
    (head_dir / "training_summary.json").write_text(json.dumps(summary, indent=2))
    length_head_card(head.config.to_dict(), summary).save(head_dir / "README.md")
    return summary


def load_length_head(name_or_path: str, drafter: PreTrainedModel | None = None, target_name: str | None = None) -> AdaFlashLengthHead:
    """Resolve ``name_or_path`` to a length head (on the drafter's device, when given), checked against ``drafter``.

    ``"auto"``: the head bundled beside the drafter of preset ``target_name`` (default: the preset whose bundled
    drafter ``drafter`` was loaded from); anything else: a local folder or Hub id.
    """
    from ..drafters import BUNDLED_DIR

    if name_or_path == "auto":
        if target_name is None and drafter is not None:
            drafter_dir = Path(drafter.name_or_path).resolve()
            target_name = drafter_dir.name if drafter_dir.parent == BUNDLED_DIR.resolve() else None
        path = BUNDLED_DIR / f"{target_name}{HEAD_FOLDER_SUFFIX}" if target_name else None
        if path is None or not (path / "config.json").is_file():
            shipped = sorted(p.name.removesuffix(HEAD_FOLDER_SUFFIX) for p in BUNDLED_DIR.glob(f"*{HEAD_FOLDER_SUFFIX}"))
            raise ValueError(
                f"No length head is bundled for {target_name or 'this drafter'!r} (bundled for: {', '.join(shipped) or 'none'}). "
                "Pass a folder or Hub id, or train one with `adaflash train-length-head --target <preset> --drafter <drafter>`."
            )
        name_or_path = str(path)
    from safetensors import SafetensorError

    from ..drafters import checkpoint_source

    name_or_path = checkpoint_source(name_or_path, "length head", "a length head is 'auto' (bundled beside a preset's "
                                     "drafter), a local folder with config.json, or a Hub id (owner/name)")
    try:
        head, info = AdaFlashLengthHead.from_pretrained(name_or_path, output_loading_info=True)
    except SafetensorError as error:
        raise OSError(f"The length head weights in {name_or_path} cannot be read ({error}): the file is corrupt or was "
                      "only partly downloaded. Download or save the checkpoint again.") from error
    broken = {k: sorted(v)[:8] for k, v in info.items() if k in ("missing_keys", "mismatched_keys") and v}
    if broken:
        raise ValueError(f"The length head in {name_or_path} is incomplete or does not match its config: {broken}. "
                         "Re-download it, or check that config.json belongs to these weights.")
    if drafter is not None:
        head.check_drafter(drafter)
        head.to(drafter.device)
    return head.eval()
