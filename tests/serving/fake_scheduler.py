"""A test double for :class:`adaflash_hf.serving.scheduler.Scheduler`, and a tiny chat tokenizer.

`FakeScheduler` answers every request with the same reply (then EOS), delivered in ragged chunks of
(2, 1, 3, ...) tokens like speculative rounds, on the caller's asyncio loop. It keeps the real
scheduler's contract (``submit`` / ``status`` / ``start`` / ``stop``, the same `RequestParams`,
`TokenEvent` and `QueueFull`, the same checks that raise ``ValueError``) and records what the server
did to it: submitted prompts and parameters, and cancellations. Knobs set by tests: ``delay_s``
(seconds before each event), ``queue_full``, ``reject`` (a ValueError message), ``fail_after``
(events before an engine error). ``drain`` makes it refuse new requests as a draining scheduler does.

`tiny_chat_tokenizer` is a byte-level BPE trained in milliseconds on text like `REPLY`, so the reply
splits multi-byte characters across tokens (and merges the end of one character with the next).
`tiny_chat_models` is a tiny random fp32 Llama over it and a fresh drafter, the stack that the demo,
server and example tests decode with.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import time

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from adaflash_hf.serving.requests import EngineNotRunning
from adaflash_hf.serving.scheduler import QueueFull, RequestParams, ShuttingDown, TokenEvent

REPLY = "Hello, wörld! Ça va? 你好，世界。 Emoji: 🙂🚀🎉 done."
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
CHUNK_SIZES = (2, 1, 3)


def tiny_chat_tokenizer() -> PreTrainedTokenizerFast:
    corpus = [REPLY, "Hello world, hello there.", "🙂🙂 🚀🚀 🎉🎉 你好 世界", "wörld Ça café naïve"] * 3
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(corpus, trainer)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    tokenizer.chat_template = CHATML
    return tokenizer


def tiny_chat_models(tokenizer: PreTrainedTokenizerFast | None = None, num_layers: int = 3, max_positions: int = 512):
    """(target, drafter, tokenizer): a tiny random fp32 Llama (seed 0) over ``tokenizer`` (default
    :func:`tiny_chat_tokenizer`) with its EOS and pad set for generate, and a block-4 drafter (seed 1)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from adaflash_hf import AdaFlashDrafter

    tokenizer = tokenizer or tiny_chat_tokenizer()
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=max_positions,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
    )
    target = LlamaForCausalLM(config).eval()
    target.generation_config.eos_token_id = tokenizer.eos_token_id
    target.generation_config.pad_token_id = tokenizer.pad_token_id
    torch.manual_seed(1)
    drafter = AdaFlashDrafter.from_target(target, num_layers=1, block_size=4).eval()
    return target, drafter, tokenizer


class FakeStream:
    """One request: yields `TokenEvent`s of the reply until EOS, ``max_new_tokens``, cancel or failure."""

    def __init__(self, scheduler: FakeScheduler, request_id: str, prompt_ids: list[int], params: RequestParams):
        self.request_id, self.prompt_ids, self.params = request_id, prompt_ids, params
        self._scheduler = scheduler
        self._tokens = scheduler.reply_ids  # reply + EOS
        self._stop_ids = set(params.stop_token_ids) or {scheduler.tokenizer.eos_token_id}
        self._chunks = itertools.cycle(CHUNK_SIZES)
        self._cancelled = threading.Event()
        self._sent = 0
        self._events = 0
        self._ended = False
        self._submitted = time.perf_counter()
        self._first_token: float | None = None
        self._done_at: float | None = None

    def cancel(self) -> None:
        if not self._ended and not self._cancelled.is_set():
            self._cancelled.set()
            self._scheduler.cancelled.append(self.request_id)

    @property
    def metrics(self) -> dict:
        end = self._done_at or time.perf_counter()
        return {
            "queue_wait_s": 0.0,
            "ttft_s": None if self._first_token is None else self._first_token - self._submitted,
            "latency_s": end - self._submitted,
            "num_tokens": self._sent,
            "rounds": self._events,
            "mean_accepted_length": self._sent / self._events if self._events else None,
        }

    def __aiter__(self):
        return self

    async def __anext__(self) -> TokenEvent:
        if self._ended:
            raise StopAsyncIteration
        await asyncio.sleep(self._scheduler.delay_s)
        event = self._next_event()
        self._ended = event.finish_reason is not None
        if self._ended:
            self._done_at = time.perf_counter()
        return event

    def _next_event(self) -> TokenEvent:
        if self._cancelled.is_set():
            return TokenEvent([], "cancelled")
        if self._scheduler.fail_after is not None and self._events >= self._scheduler.fail_after:
            return TokenEvent([], "error", "RuntimeError: injected engine failure")
        budget = self.params.max_new_tokens - self._sent
        tokens = self._tokens[self._sent : self._sent + min(next(self._chunks), budget)]
        finish_reason = None
        for i, token in enumerate(tokens):
            if token in self._stop_ids:
                tokens, finish_reason = tokens[: i + 1], "stop"
                break
        self._sent += len(tokens)
        self._events += 1
        self._first_token = self._first_token or time.perf_counter()
        if finish_reason is None and self._sent >= self.params.max_new_tokens:
            finish_reason = "length"
        return TokenEvent(tokens, finish_reason)


class FakeScheduler:
    def __init__(self, tokenizer, model_name: str = "fake-model", max_context: int = 128, reply: str = REPLY):
        self.tokenizer, self.model_name, self.max_context = tokenizer, model_name, max_context
        self.reply_ids = tokenizer.encode(reply, add_special_tokens=False) + [tokenizer.eos_token_id]
        self.running = False
        self.submitted: list[tuple[list[int], RequestParams]] = []
        self.cancelled: list[str] = []
        self.reset()
        self._ids = itertools.count()

    def reset(self) -> None:
        """Back to a well-behaved scheduler (tests change these knobs)."""
        self.delay_s = 0.0
        self.queue_full = False
        self.reject: str | None = None
        self.fail_after: int | None = None
        self.draining = False

    @property
    def ready(self) -> bool:
        return self.running

    def drain(self, timeout: float) -> None:
        self.draining = True

    def start(self) -> None:
        self.running = True

    def stop(self) -> None:
        self.running = False

    def submit(self, prompt_ids: list[int], params: RequestParams) -> FakeStream:
        asyncio.get_running_loop()  # like the real one: only from a running loop
        if not prompt_ids:
            raise ValueError("the prompt is empty: give at least one token.")
        if not all(0 <= t < len(self.tokenizer) for t in prompt_ids):
            raise ValueError(f"prompt token ids are outside the vocabulary (0..{len(self.tokenizer) - 1}).")
        if len(prompt_ids) + params.max_new_tokens > self.max_context:
            raise ValueError(
                f"the prompt has {len(prompt_ids)} tokens and asks for {params.max_new_tokens} more, past "
                f"this model's context of {self.max_context} tokens: shorten the prompt or lower max_tokens."
            )
        if self.reject is not None:
            raise ValueError(self.reject)
        if not self.running:
            raise EngineNotRunning("the scheduler is not running: call start() or run() first.", retry_after=5.0)
        if self.draining:
            raise ShuttingDown("the server is shutting down and takes no new requests; retry later.", retry_after=5)
        if self.queue_full:
            raise QueueFull("the queue is full (0 requests waiting); retry later.", retry_after=2.5)
        self.submitted.append((list(prompt_ids), params))
        return FakeStream(self, f"req-{next(self._ids)}", list(prompt_ids), params)

    def round_stats(self) -> dict:
        return {"batch_size": 0, "round_tokens": {}, "drafts": {}}

    def status(self) -> dict:
        return {
            "running": self.running,
            "queued": 0,
            "active": 0,
            "counters": {"submitted": len(self.submitted), "cancelled": len(self.cancelled), "draft_failures": 0},
        }
