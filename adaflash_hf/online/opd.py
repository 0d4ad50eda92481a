"""On-policy distillation while serving: ``AdaFlashOPD(target, drafter, OPDConfig(...))``.

Data flow:

1. **Record.** The engine hands every verified round to :attr:`AdaFlashOPD.observer`; finished
   requests become :class:`~.trajectories.Trajectory` objects in a bounded buffer (no extra target pass).
2. **Train.** The trainer takes trajectories (every ``check_every``-th one is kept apart for
   the acceptance check), and trains LoRA adapters on its own copy of the drafter with
   α·CE + (1−α)·clipped reverse KL on the target's top-k distribution, the position decay, and
   ``rejected_weight`` on positions where verification rejected a drafter draft (Draft-OPD).
   It computes at most ``duty_cycle`` of wall time while requests run. Where it runs (``worker``):
   - ``inline`` (the default on a CPU): in the engine's own thread, one batch at a time between
     rounds (``observer.before_round()``), plus whenever the serving engine is idle. Serving and
     training never compete for cores, and training uses all of the engine's threads. On a CPU a
     second thread running torch would own a second OpenMP team, which slows both (libgomp;
     ``adaflash_hf/serving/torch_thread.py``), and a trainer thread on one of two cores stalls
     every parallel region of serving that waits for that core.
   - ``thread``: a background thread with ``train_threads`` threads (for accelerators, where the
     device overlaps the two).
3. **Check and publish.** Every ``steps_per_version`` steps the candidate is compared with the
   serving version by teacher-forced τ on the held-out trajectories, and with the base drafter on
   the retention set (training prompts with the target's responses, ``retention.safetensors``; it
   may lose at most ``max_retention_drop``); only a candidate that passes both is published (a new
   version; optionally written to ``publish_dir``). Rehearsal mixes more such samples into batches.
4. **Swap.** The serving drafter's :class:`~.adapters.AdapterSlot` applies the newest version on the
   engine thread, in ``observer.before_round()``: between rounds, never mid-round.

Faults stop training, never serving: a non-finite loss or gradient rolls the trainer back to the last
good adapter; a worker that dies is reported by :meth:`~AdaFlashOPD.check_health` (and restarted up
to ``max_restarts`` times); a version that fails its check is not published.
"""

from __future__ import annotations

import logging
import threading
import time

import torch
from transformers import PreTrainedModel

from ..modeling_adaflash import AdaFlashDrafter
from .adapters import AdapterSlot, LoraSettings, attach_lora
from .configs import OPDConfig
from .distiller import OnlineDistiller, WorkerKilled
from .trajectories import TrajectoryBuffer, TrajectoryRecorder

logger = logging.getLogger(__name__)


class _Observer:
    """What the engine calls: records trajectories, trains (inline) and applies new adapter versions between rounds."""

    def __init__(self, recorder: TrajectoryRecorder, slot: AdapterSlot, on_swap, train=None):
        self.recorder, self.slot, self.on_swap, self.train = recorder, slot, on_swap, train

    def before_round(self) -> None:
        if self.train is not None:
            self.train()
        if self.slot.apply_pending():
            self.on_swap(self.slot.version)

    def on_prefill(self, *args) -> None:
        self.recorder.on_prefill(*args)

    def on_round(self, *args) -> None:
        self.recorder.on_round(*args)

    def on_finish(self, row_id) -> None:
        self.recorder.on_finish(row_id)


class AdaFlashOPD(OnlineDistiller):
    """On-policy distillation of ``drafter`` towards ``target``'s live traffic, while it is served.

    ``drafter`` becomes the serving drafter: a zero-initialised LoRA adapter is injected into it in
    place (outputs unchanged until the first swap). Pass :attr:`observer` to the engine
    (``adaflash_hf.generate(..., observer=opd.observer)``, ``SpeculativeBatch(observer=...)``), or call
    :meth:`attach` so every ``generate`` / ``target.generate(assistant_model=drafter)`` on ``target``
    uses it. Then :meth:`start`; :meth:`status` reports; :meth:`stop` joins the worker. What a unit of
    training does (a batch, the version check, publication) is :class:`~.distiller.OnlineDistiller`'s.
    """

    def __init__(
        self,
        target: PreTrainedModel,
        drafter: AdaFlashDrafter,
        config: OPDConfig | None = None,
        base_drafter_name: str = "adaflash-drafter",
        retention: list | None = None,
    ):
        """``retention``: text of the domains the drafter was trained on, for the retention check and
        rehearsal: ``(token ids, prompt length)`` pairs, or token id lists (read as prompt-less). Default:
        the drafter folder's ``retention.safetensors`` (prompts with the target's responses), else
        responses of its datastore; ``retention_trajectories`` of them for the check, a pool for
        rehearsal. A drafter with neither gets no retention check unless these are given."""
        if not isinstance(drafter, AdaFlashDrafter):
            raise TypeError(f"AdaFlashOPD trains an AdaFlashDrafter, got {type(drafter).__name__}.")
        self.config = config or OPDConfig()
        self.target, self.drafter, self.base_drafter_name = target, drafter, base_drafter_name
        self.settings = LoraSettings(self.config.lora_rank, self.config.lora_alpha)
        if getattr(drafter, "adaflash_lora", None) is None:
            attach_lora(drafter, self.settings)
        self.slot = AdapterSlot(drafter)
        self.buffer = TrajectoryBuffer(self.config.buffer_trajectories, self.config.buffer_mb * 2**20)
        self.recorder = TrajectoryRecorder(self.buffer, top_k=self.config.top_k)
        self.observer = _Observer(self.recorder, self.slot, self._on_swap)  # its train hook is set below, for inline
        self._init_trainer(retention)
        device = next(target.parameters()).device
        self.inline = self.config.worker == "inline" or (self.config.worker == "auto" and device.type == "cpu")
        self.observer.train = self.train_between_rounds if self.inline else None
        self._inline_on = False  # inline: between start() and stop()
        self._credit = 0.0  # inline: seconds of training the duty cycle allows now
        self._tick: float | None = None
        self.idle_train_seconds = 0.0  # inline: training done while the engine had no requests
        self._stop = threading.Event()
        self._health_lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self.started_at: float | None = None

    # ----------------------------------------------------------------------------------------------
    # lifecycle
    def attach(self, target: PreTrainedModel | None = None) -> AdaFlashOPD:
        """Make every AdaFlash generation on ``target`` (default: the OPD target) record and swap."""
        (target or self.target).adaflash_observer = self.observer
        return self

    def detach(self, target: PreTrainedModel | None = None) -> None:
        t = target or self.target
        if getattr(t, "adaflash_observer", None) is self.observer:
            del t.adaflash_observer

    def start(self) -> AdaFlashOPD:
        self._stop.clear()
        self.started_at = self.started_at or time.perf_counter()
        if self.inline:  # nothing to start: the engine trains between rounds (train_between_rounds)
            self._inline_on, self._tick = True, time.perf_counter()
            if self.state in ("idle", "stopped"):
                self.state = "waiting for data"
            return self
        if self._thread is not None and self._thread.is_alive():
            return self
        self._thread = threading.Thread(target=self._run, name="adaflash-opd", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 30.0) -> None:
        self._stop.set()
        self._inline_on = False
        if self._thread is not None:
            self._thread.join(timeout)
        self.state = "stopped"

    @property
    def alive(self) -> bool:
        """Whether training goes on: the worker thread runs, or inline training is on and has not died."""
        if self.inline:
            return self._inline_on and self.state not in ("dead", "failed")
        return self._thread is not None and self._thread.is_alive()

    def wants_idle_time(self) -> bool:
        """Inline: whether an idle engine has something to train on (new trajectories or replay)."""
        return (
            self.alive
            and self.buffer.added >= self.config.min_trajectories
            and (len(self.buffer) > 0 or len(self.replay) >= self.config.batch_trajectories)
        )

    def train_between_rounds(self, idle: bool = False) -> bool:
        """Inline: train one batch in the calling (engine) thread if the duty cycle allows it now, or
        unconditionally when ``idle`` (the engine has no requests). Returns whether it trained.
        Never raises: a fault stops training (``status()``), and ``check_health()`` restarts it."""
        if not self.inline or not self.alive:
            return False
        now = time.perf_counter()
        gap = min(now - (self._tick or now), 1.0)  # budget accrues while rounds run, not across long pauses
        self._credit = min(self._credit + self.config.duty_cycle * gap, 1.0)
        self._tick = now
        if not idle and self._credit <= 0:
            return False
        try:
            with torch.inference_mode(False), torch.enable_grad():  # the engine's rounds run in inference mode
                work = self._work_once(wait=0.0)
        except WorkerKilled:
            self.errors.append("worker killed")
            self.state = "dead"
            return False
        except Exception as exc:  # a bug in training must never reach serving
            logger.exception("OPD training failed")
            self.errors.append(f"worker failed: {type(exc).__name__}: {exc}")
            self.state = "dead"
            return False
        if idle:  # idle time is free: it neither spends nor earns budget
            self.idle_train_seconds += work
            self._tick = time.perf_counter()
        else:  # the budget earned over this batch's own time is added at the next call
            self._credit -= work
        return work > 0

    def check_health(self) -> bool:
        """Whether the worker runs; a dead one is restarted (up to ``max_restarts``) from the last good adapter."""
        with self._health_lock:  # the engine thread and a supervisor may both ask
            return self._check_health()

    def _check_health(self) -> bool:
        if self.inline:
            if not self._inline_on or self.state != "dead":
                return self.alive
            if self.counters["restarts"] >= self.config.max_restarts:
                self.state = "failed"
                return False
            self.counters["restarts"] += 1
            self._rollback()
            self.state = "waiting for data"
            return True
        if self._thread is None or self._thread.is_alive() or self._stop.is_set():
            return self._thread is not None and self._thread.is_alive()
        if self.counters["restarts"] >= self.config.max_restarts:
            self.state = "failed"
            return False
        self.counters["restarts"] += 1
        self._rollback()
        self._thread = None
        self.start()
        return True

    def inject_fault(self, kind: str) -> None:
        """For reliability tests: "nan" poisons the next step's gradient; "kill" kills the worker thread."""
        if kind not in ("nan", "kill"):
            raise ValueError(f"unknown fault {kind!r}: use 'nan' or 'kill'.")
        self._faults.add(kind)

    def status(self) -> dict:
        alive = self.alive
        elapsed = time.perf_counter() - self.started_at if self.started_at else 0.0
        return {
            # stop() from another thread can land while an inline batch is still under way and sets its own state after
            "state": self.state
            if alive or self.state in ("stopped", "failed", "idle")
            else "stopped"
            if self._stop.is_set()
            else "dead",
            "worker": "inline" if self.inline else "thread",
            "worker_alive": alive,
            "adapter_version": self.slot.version,
            "published_version": self.version,
            "last_loss": self.last_loss,
            "last_check": self.last_check,
            "train_seconds": round(self.train_seconds, 2),
            "train_share": round(self.train_seconds / elapsed, 3) if elapsed else 0.0,
            "idle_train_seconds": round(self.idle_train_seconds, 2),
            "buffer": self.buffer.counters(),
            "check_set": len(self.check_set),
            "retention": {
                "check": len(self.retention_set),
                "rehearsal": len(self.rehearsal_set),
                "pending": len(self._retention_text),
                "base_tau": None if self.retention_base_tau is None else round(self.retention_base_tau, 4),
            },
            "errors": list(self.errors),
            "tau_history": list(self.tau_history),
            **self.counters,
        }

    def _on_swap(self, version: int) -> None:
        self.counters["swaps"] += 1
        logger.info("serving adapter v%d", version)

    # ----------------------------------------------------------------------------------------------
    # the worker
    def _run(self) -> None:
        """The worker thread (``worker='thread'``): train, then sleep so that training is ``duty_cycle`` of wall
        time."""
        torch.set_num_threads(self.config.train_threads)  # this thread's pool only; serving keeps its threads
        try:
            while not self._stop.is_set():
                work = self._work_once(wait=0.5)  # waits up to 0.5 s for a trajectory once there is enough data
                if not work and self.buffer.added < self.config.min_trajectories:
                    self._stop.wait(0.2)
                elif work and self.config.duty_cycle < 1:  # yield the CPU to serving
                    self._stop.wait(work * (1 - self.config.duty_cycle) / self.config.duty_cycle)
        except WorkerKilled:
            self.errors.append("worker killed")
            self.state = "dead"
        except Exception as exc:  # a bug in training must never reach serving
            logger.exception("OPD worker failed")
            self.errors.append(f"worker failed: {type(exc).__name__}: {exc}")
            self.state = "dead"
