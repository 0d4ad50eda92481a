"""The learning half of on-line distillation: :class:`OnlineDistiller` trains a LoRA copy of the drafter.

One unit of work (:meth:`OnlineDistiller._work_once`) takes a batch of trajectories (new ones first, else
replay, plus rehearsal of the drafter's own training domains), takes ``passes`` optimizer steps on the OPD
loss (α·CE + (1−α)·clipped reverse KL on the target's top-k, position decay, ``rejected_weight``), and
every ``steps_per_version`` steps checks the candidate against the serving version (held-out τ) and the
base drafter (retention τ) before it is published. When and in which thread that work runs is
:class:`~adaflash_hf.online.opd.AdaFlashOPD`'s.
"""

from __future__ import annotations

import copy
import math
import threading
import time
from collections import deque

import torch

from ..heap import release_freed_heap
from ..training.anchors import block_labels, sample_anchors
from ..training.data import IGNORE_INDEX
from ..training.losses import default_gamma, opd_topk_loss, position_weights
from ..training.step import (
    acceptance_counts,
    block_hidden_states,
    compute_autocast,
    draft_logits,
    to_draft_ids,
    to_target_ids,
)
from .adapters import adapter_state, publish_adapter
from .trajectories import Trajectory, retention_samples, teacher_forced_trajectory


class WorkerKilled(BaseException):
    """Raised inside the worker by ``inject_fault("kill")``: the thread dies as if killed."""


class OnlineDistiller:
    """The trainer's state (its LoRA copy, optimizer, check and retention sets, counters) and its unit of work.

    A subclass sets ``config``, ``target``, ``drafter``, ``settings``, ``slot``, ``buffer`` and
    ``base_drafter_name``, then calls :meth:`_init_trainer`.
    """

    RETENTION_TOKENS = 128  # tokens of each retention / rehearsal sequence
    RETENTION_ANCHORS = 64  # blocks per retention trajectory in its check (4x the training step's: a 2 % loss is small)
    REHEARSAL_POOL = 16  # rehearsal sequences kept (at least), drawn from for every batch

    def _init_trainer(self, retention: list | None) -> None:
        """The trainer's state; ``retention`` as in :class:`~adaflash_hf.online.opd.AdaFlashOPD`."""
        # The trainer's own copy: fp32 LoRA weights, base frozen; the serving drafter is never touched by it.
        self.train_model = copy.deepcopy(self.drafter).float().train()
        for name, param in self.train_model.named_parameters():
            param.requires_grad_("lora_" in name)
        self.good_state = adapter_state(self.train_model)  # the published (serving) adapter
        self.check_set: deque[Trajectory] = deque(maxlen=self.config.check_size)
        self.replay: deque[Trajectory] = deque(maxlen=self.config.replay_trajectories)
        # Retention: trajectories of the drafter's own training domains, built from text on the first
        # training calls (a few target forwards per call); the check set guards publication, the
        # rest is rehearsed in every batch.
        rehearsal_pool = (
            max(self.REHEARSAL_POOL, 4 * self.config.rehearsal_trajectories)
            if self.config.rehearsal_trajectories
            else 0
        )
        wanted = self.config.retention_trajectories + rehearsal_pool
        samples = (
            retention_samples(self.drafter, wanted, self.RETENTION_TOKENS) if retention is None else list(retention)
        )
        samples = [s if isinstance(s, tuple) else (list(s), 1) for s in samples][:wanted]
        self._retention_text = samples[0::2] + samples[1::2]  # the check set (built first) and the pool both span them
        self.retention_set: list[Trajectory] = []
        self.rehearsal_set: list[Trajectory] = []
        self.retention_base_tau: float | None = None
        self.version = 0  # the published adapter version
        self._lock = threading.Lock()
        self._faults: set[str] = set()
        self._generator = torch.Generator().manual_seed(self.config.seed)
        self._optimizer = self._new_optimizer()
        self._taken = 0
        self._steps_since_check = 0
        self.counters = {
            "steps": 0,
            "nan_steps": 0,
            "step_errors": 0,
            "published": 0,
            "rejected_versions": 0,
            "restarts": 0,
            "swaps": 0,
            "trained_trajectories": 0,
            "replayed_batches": 0,
            "retention_rejections": 0,
        }
        self.train_seconds = 0.0
        self.state = "idle"
        self.last_loss: float | None = None
        self.last_check: dict | None = None
        self.errors: deque[str] = deque(maxlen=20)
        self.tau_history: deque[dict] = deque(maxlen=1000)

    def _work_once(self, wait: float) -> float:
        """Train on one batch (``passes`` steps; new trajectories first, else replay), check and publish
        when due; returns the seconds it took (0.0: nothing to train on)."""
        if "kill" in self._faults:
            self._faults.discard("kill")
            raise WorkerKilled("injected")
        if self.buffer.added < self.config.min_trajectories:
            self.state = "waiting for data"
            return 0.0
        if self._retention_text:
            return self._build_retention()
        replay_ready = len(self.replay) >= self.config.batch_trajectories
        batch = self._take_batch(timeout=0.0 if replay_ready else wait)
        if not batch and replay_ready:  # nothing new: revisit recent ones
            picks = torch.randperm(len(self.replay), generator=self._generator)[: self.config.batch_trajectories]
            batch = [self.replay[i] for i in picks.tolist()]
            self.counters["replayed_batches"] += 1
        if not batch:
            self.state = "waiting for data"
            return 0.0
        self.state = "training"
        tick = time.perf_counter()
        batch = self.with_rehearsal(batch)
        for _ in range(self.config.passes):
            self._guarded_step(batch)
        self._steps_since_check += self.config.passes
        if self._steps_since_check >= self.config.steps_per_version:
            self._steps_since_check = 0
            self._check_and_publish()
            release_freed_heap()
        work = time.perf_counter() - tick
        self.train_seconds += work
        return work

    def with_rehearsal(self, batch: list[Trajectory], generator: torch.Generator | None = None) -> list[Trajectory]:
        """``batch`` plus ``rehearsal_trajectories`` random trajectories of the rehearsal pool (none while it is
        empty)."""
        if not self.rehearsal_set:
            return batch
        picks = torch.randperm(len(self.rehearsal_set), generator=generator or self._generator)[
            : self.config.rehearsal_trajectories
        ]
        return batch + [self.rehearsal_set[i] for i in picks.tolist()]

    def _build_retention(self) -> float:
        """Turn up to ``batch_trajectories`` retention sequences into trajectories (one target forward
        each); once all are built, measure the base drafter's retention τ. Returns the seconds taken."""
        self.state = "preparing retention check"
        tick = time.perf_counter()
        layer_ids = self.drafter.config.target_layer_ids
        for _ in range(min(self.config.batch_trajectories, len(self._retention_text))):
            tokens, prompt_len = self._retention_text.pop(0)
            if not 1 <= prompt_len < len(tokens):
                continue
            trajectory = teacher_forced_trajectory(
                self.target, layer_ids, tokens, prompt_len, self.config.top_k, tag="retention"
            )
            if len(self.retention_set) < self.config.retention_trajectories:
                self.retention_set.append(trajectory)
            else:
                self.rehearsal_set.append(trajectory)
        if not self._retention_text and self.retention_set:
            self.retention_base_tau, _ = self.held_out_tau(self.good_state, self.retention_set, self.RETENTION_ANCHORS)
        work = time.perf_counter() - tick
        self.train_seconds += work
        return work

    def _take_batch(self, timeout: float) -> list[Trajectory]:
        batch = []
        for trajectory in self.buffer.take(self.config.batch_trajectories, timeout=timeout):
            self._taken += 1
            if self._taken % self.config.check_every == 0:
                self.check_set.append(trajectory)
            else:
                batch.append(trajectory)
        self.counters["trained_trajectories"] += len(batch)
        self.replay.extend(batch)
        return batch

    def _new_optimizer(self) -> torch.optim.Optimizer:
        params = [p for p in self.train_model.parameters() if p.requires_grad]
        return torch.optim.AdamW(params, lr=self.config.lr, weight_decay=0.0)

    def _rollback(self) -> None:
        """Restore the trainer to the serving adapter and forget the optimizer's moments."""
        from peft import set_peft_model_state_dict

        state = {k.removeprefix("base_model.model."): v.clone() for k, v in self.good_state.items()}
        set_peft_model_state_dict(self.train_model, state)
        self._optimizer = self._new_optimizer()

    def _guarded_step(self, batch: list[Trajectory]) -> None:
        try:
            loss = self._step(batch)
        except FloatingPointError as exc:
            self.counters["nan_steps"] += 1
            self.errors.append(f"step {self.counters['steps']}: {exc}; rolled back to v{self.version}")
            self._rollback()
            return
        except (RuntimeError, ValueError) as exc:
            self.counters["step_errors"] += 1
            self.errors.append(
                f"step {self.counters['steps']}: {type(exc).__name__}: {exc}; rolled back to v{self.version}"
            )
            self._rollback()
            return
        self.last_loss = loss
        self.counters["steps"] += 1

    def _step(self, batch: list[Trajectory]) -> float:
        """One optimizer step on a batch; raises FloatingPointError on a non-finite loss or gradient."""
        with self._autocast():
            loss, _ = self._loss(self.train_model, batch, with_grad=True)
        if not math.isfinite(float(loss.detach())):
            raise FloatingPointError(f"non-finite loss {float(loss.detach())}")
        self._optimizer.zero_grad(set_to_none=True)
        loss.backward()
        params = [p for p in self.train_model.parameters() if p.requires_grad]
        if "nan" in self._faults:
            self._faults.discard("nan")
            params[0].grad.fill_(float("nan"))
        norm = torch.nn.utils.clip_grad_norm_(params, self.config.max_grad_norm)
        if not math.isfinite(float(norm)):
            raise FloatingPointError(f"non-finite gradient norm {float(norm)}")
        self._optimizer.step()
        return float(loss.detach())

    def _autocast(self):
        """bf16 compute for the fp32 LoRA copy where bf16 is the faster dtype, as in offline training (the
        target's weights stay as they are)."""
        weight = next(self.target.parameters())
        return compute_autocast(weight.device, weight.dtype)

    def _loss(self, model, batch: list[Trajectory], with_grad: bool, num_anchors: int | None = None):
        """OPD loss and teacher-forced (accepted (N,), predictions, labels) over a batch of trajectories."""
        cfg = self.config
        block_size = model.config.block_size
        num_positions = cfg.loss_positions or block_size - 1
        gamma = cfg.gamma or default_gamma(block_size)
        device = next(self.target.parameters()).device
        tokens, context, label_mask, labels, teacher_ids, teacher_lp, rejected = _collate(batch, device)
        context = context.to(
            next(model.parameters()).dtype
        )  # stored as bf16; exact in fp32, and autocast casts back where it runs
        anchors, valid = sample_anchors(label_mask, num_anchors or cfg.num_anchors, self._generator)
        block_lab = block_labels(labels, label_mask, anchors, valid, block_size, input_ids=tokens)[
            :, :, :num_positions
        ]  # (b, A, K)
        keep = block_lab != IGNORE_INDEX
        with torch.set_grad_enabled(with_grad):
            hidden = block_hidden_states(
                model, self.target.get_input_embeddings(), tokens, context, anchors, num_positions
            )  # (b, A, K, H)
            logits = draft_logits(model, self.target.get_output_embeddings(), hidden[keep])  # (n, V_draft)
            label_pos = anchors[:, :, None] + torch.arange(1, num_positions + 1, device=device)  # (b, A, K)
            rows = torch.arange(len(batch), device=device)[:, None, None].expand_as(label_pos)
            r, t = rows[keep], label_pos[keep]
            vocab_size = self.target.get_output_embeddings().weight.shape[0]
            ids = to_draft_ids(teacher_ids[r, t].long(), model, vocab_size)  # (n, k)
            weights = position_weights(block_size, gamma, num_positions).to(device).expand_as(label_pos)[keep]
            weights = weights * torch.where(rejected[r, t], cfg.rejected_weight, 1.0)
            loss = (
                opd_topk_loss(logits, ids, teacher_lp[r, t], weights, cfg.alpha, cfg.clip)
                if len(r)
                else logits.sum() * 0
            )
        predictions = torch.full_like(block_lab, IGNORE_INDEX)
        predictions[keep] = to_target_ids(logits.detach().argmax(-1), model)
        return loss, acceptance_counts(predictions.cpu(), block_lab.cpu())

    @torch.no_grad()
    def held_out_tau(
        self,
        state: dict[str, torch.Tensor] | None = None,
        trajectories: list[Trajectory] | None = None,
        num_anchors: int | None = None,
    ) -> tuple[float, list[float]]:
        """Teacher-forced τ and per-position acceptance of the trainer's drafter (or of ``state``) on held-out
        trajectories, over ``num_anchors`` blocks of each (default: the training step's)."""
        from peft import set_peft_model_state_dict

        trajectories = list(self.check_set) if trajectories is None else trajectories
        if not trajectories:
            return float("nan"), []
        saved = None
        if state is not None:
            saved = adapter_state(self.train_model)
            set_peft_model_state_dict(
                self.train_model, {k.removeprefix("base_model.model."): v for k, v in state.items()}
            )
        generator_state = self._generator.get_state()
        self._generator.manual_seed(12345)  # the same anchors for every version compared
        try:
            with self._autocast():
                accepted, hits, seen = [], 0, 0
                for i in range(0, len(trajectories), self.config.batch_trajectories):
                    _, (acc, h, s) = self._loss(
                        self.train_model,
                        trajectories[i : i + self.config.batch_trajectories],
                        with_grad=False,
                        num_anchors=num_anchors,
                    )
                    accepted.append(acc)
                    hits, seen = hits + h, seen + s
        finally:
            self._generator.set_state(generator_state)
            if saved is not None:
                set_peft_model_state_dict(
                    self.train_model, {k.removeprefix("base_model.model."): v for k, v in saved.items()}
                )
        accepted = torch.cat(accepted).float()
        return 1.0 + float(accepted.mean()) if len(accepted) else float("nan"), (hits / seen.clamp_min(1)).tolist()

    def _check_and_publish(self) -> None:
        """Publish the candidate only if its held-out τ is at least the serving version's (+ min_improvement)."""
        candidate = adapter_state(self.train_model)
        if not self.check_set:
            return
        cand_tau, positions = self.held_out_tau()
        serving_tau, _ = self.held_out_tau(self.good_state)
        passed = math.isfinite(cand_tau) and cand_tau >= serving_tau + self.config.min_improvement
        self.last_check = {
            "candidate_tau": round(cand_tau, 4),
            "serving_tau": round(serving_tau, 4),
            "passed": passed,
            "position_acceptance": [round(p, 3) for p in positions],
            "check_trajectories": len(self.check_set),
        }
        if passed and self.retention_base_tau is not None:  # the domains the drafter was trained on must not suffer
            retained, _ = self.held_out_tau(trajectories=self.retention_set, num_anchors=self.RETENTION_ANCHORS)
            floor = self.retention_base_tau * (1 - self.config.max_retention_drop)
            passed = math.isfinite(retained) and retained >= floor
            self.last_check.update(
                passed=passed, retention_tau=round(retained, 4), retention_base_tau=round(self.retention_base_tau, 4)
            )
            if not passed:
                self.counters["retention_rejections"] += 1
        if not passed:
            self.counters["rejected_versions"] += 1
            return
        with self._lock:
            self.version += 1
            version = self.version
        self.good_state = candidate
        self.slot.offer(version, candidate)
        self.counters["published"] += 1
        self.tau_history.append({"requests": self.buffer.added, "version": version, "tau": round(cand_tau, 4)})
        if self.config.publish_dir:
            try:
                publish_adapter(
                    self.config.publish_dir,
                    version,
                    candidate,
                    self.settings,
                    self.base_drafter_name,
                    {
                        "tau": cand_tau,
                        "previous_tau": serving_tau,
                        "requests": self.buffer.added,
                        "tau_kind": "teacher-forced, held-out live trajectories",
                    },
                    target=getattr(self.target, "name_or_path", None),
                )
            except OSError as exc:
                self.errors.append(f"could not write v{version} to {self.config.publish_dir}: {exc}")


def _collate(batch: list[Trajectory], device) -> tuple[torch.Tensor, ...]:
    """Right-pad trajectories: tokens (b, L), context (b, L, F), label_mask (b, L) on generated tokens,
    labels (b, L) the target's argmax behind each token, teacher ids/logprobs (b, L, k) behind each
    token, rejected (b, L)."""
    length = max(len(t.tokens) for t in batch)
    b, k = len(batch), batch[0].teacher_ids.shape[1]
    feat = batch[0].features.shape[1]
    tokens = torch.zeros(b, length, dtype=torch.long)
    context = torch.zeros(b, length, feat, dtype=batch[0].features.dtype)
    label_mask = torch.zeros(b, length, dtype=torch.bool)
    labels = torch.full((b, length), IGNORE_INDEX, dtype=torch.long)
    teacher_ids = torch.full((b, length, k), -1, dtype=torch.int32)
    teacher_lp = torch.zeros(b, length, k)
    rejected = torch.zeros(b, length, dtype=torch.bool)
    for i, t in enumerate(batch):
        n, p = len(t.tokens), t.prompt_len
        tokens[i, :n] = t.tokens
        context[i, : len(t.features)] = t.features
        label_mask[i, p:n] = True
        teacher_ids[i, p:n] = t.teacher_ids
        teacher_lp[i, p:n] = t.teacher_logprobs
        labels[i, p:n] = t.teacher_ids[:, 0].long()
        rejected[i, :n] = t.rejected
    return tuple(x.to(device) for x in (tokens, context, label_mask, labels, teacher_ids, teacher_lp, rejected))
