"""Prepacked oneDNN weights for bf16 and fp32 linear layers on a CPU: a cheaper forward.

bf16: torch's ``F.linear`` on a CPU hands oneDNN the weight in its plain (out, in) layout, and the
kernel lays it out afresh for its blocking on every call. At decoding's shapes (a few tokens against
every weight of the model) that is a large share of a step: SmolLM2-135M, bf16, 2 threads, one token
42 -> 30 ms, sixteen tokens 76 -> 66 ms (``docs/research-log.md``, no mask; through
``generate`` the gain is smaller, and ``adaflash bench`` times the stock kernels as ``target-stock`` beside
the packed target's ``target``). Packing each weight once, as torch's own inductor does when it freezes a
CPU graph, gives bit-identical outputs (the same kernel on the same numbers; ``tests/test_kernels.py``
checks whole models) and makes plain decoding and speculative rounds alike cheaper.

fp32: stock ``F.linear`` goes to MKL's sgemm, which on AMD CPUs without AVX-512 is slow for a few rows
(SmolLM2's 49k-row lm_head: 12.6 ms for one token and 32.1 ms for sixteen against oneDNN's packed
6.2 and 12.8 ms on a 2-core Zen 2 EPYC with AVX2; ``docs/research-log.md``). oneDNN's packed
fp32 kernel computes the same products in another order: outputs agree to fp32 rounding (logits within
1e-4 on SmolLM2; ``docs/research-log.md``), not bit for bit, with stock. Plain
decoding and verification both run through the packed model, so speculative output still equals that model's
own output.

Both are packed only where the packed kernel measures faster on this CPU (:func:`packing_pays`) and
the packed copy fits in half of the memory still available (:func:`available_memory_bytes`): a 7B fp32 model
would need another 28 GB.

:func:`pack_linear_weights` swaps the class of every bf16 or fp32 ``nn.Linear`` of a module for
:class:`PackedLinear` in place: parameters, state dict keys, tied weights and hooks stay as they were,
and the packed copy is an extra attribute (one more copy of the linear weights in memory). A packed
layer falls back to ``F.linear`` whenever packing cannot apply: autograd on, an input of another dtype, or
a weight changed in place since it was packed (it repacks on the next no-grad call). A change made
through ``weight.data`` bypasses torch's version counter: call :func:`pack_linear_weights` again after one.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import logging
import time
from collections.abc import Iterator

import torch
import torch.nn.functional as F

logger = logging.getLogger(__name__)

PACK_HINT = 16  # tokens per call oneDNN lays the weight out for (verification's typical width)
PACKED_DTYPES = (torch.bfloat16, torch.float32)


@functools.cache
def packing_available(dtype: torch.dtype = torch.bfloat16) -> bool:
    """Whether this torch build has oneDNN's linear ops for ``dtype`` (bf16: x86 CPUs with AVX512 or AMX)."""
    if dtype not in PACKED_DTYPES:
        return False
    try:
        ok = torch.backends.mkldnn.is_available() and (
            dtype != torch.bfloat16 or torch.ops.mkldnn._is_mkldnn_bf16_supported()
        )
        if ok:
            weight = torch.zeros(8, 8, dtype=dtype)
            packed = torch.ops.mkldnn._reorder_linear_weight(weight, PACK_HINT)
            torch.ops.mkldnn._linear_pointwise(torch.zeros(1, 8, dtype=dtype), packed, None, "none", [], "")
        return bool(ok)
    except (AttributeError, RuntimeError, NotImplementedError) as err:
        logger.info("packed %s linear weights unavailable: %s", dtype, err)
        return False


def pack_weight(weight: torch.Tensor) -> torch.Tensor:
    """(out, in) bf16 or fp32 CPU weight -> oneDNN's blocked copy of it, for :func:`packed_linear`."""
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach().contiguous(), PACK_HINT)


def packed_linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` with the weight prepacked by :func:`pack_weight`; (..., in) -> (..., out)."""
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


def can_pack(weight: torch.Tensor) -> bool:
    return weight.dtype in PACKED_DTYPES and weight.device.type == "cpu" and weight.dim() == 2


def use_packed(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether a packed copy of ``weight`` may serve this call (no autograd, bf16 or fp32 on the CPU, input of the
    weight's dtype)."""
    return not torch.is_grad_enabled() and x.dtype == weight.dtype and x.device.type == "cpu" and can_pack(weight)


class PackedLinear(torch.nn.Linear):
    """An ``nn.Linear`` that also keeps a oneDNN-packed copy of its weight (made by :func:`pack_linear_weights`)."""

    packed: torch.Tensor | None
    packed_from: tuple[int, int] | None  # (data_ptr, version) of the weight the copy was made from
    packed_enabled: bool

    def _fresh_packed(self) -> torch.Tensor | None:
        weight = self.weight
        stamp = (weight.data_ptr(), weight._version)
        if self.packed is None or self.packed_from != stamp:
            self.packed, self.packed_from = pack_weight(weight), stamp
        return self.packed

    def __deepcopy__(self, memo):
        """A copy without the packed weight (an opaque oneDNN tensor cannot be copied); it repacks on first use."""
        clone = self.__class__.__new__(self.__class__)
        memo[id(self)] = clone
        for key, value in self.__dict__.items():
            clone.__dict__[key] = None if key in ("packed", "packed_from") else copy.deepcopy(value, memo)
        return clone

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.packed_enabled and use_packed(x, self.weight):
            return packed_linear(x, self._fresh_packed(), self.bias)
        return F.linear(x, self.weight, self.bias)


def _linears(module: torch.nn.Module) -> Iterator[torch.nn.Linear]:
    return (m for m in module.modules() if isinstance(m, torch.nn.Linear))


def median_ms(fn, repeats: int = 7) -> float:
    """Median milliseconds of ``fn()`` over ``repeats`` calls, after one warm-up call."""
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return sorted(times)[repeats // 2] * 1e3


@torch.inference_mode()
def packing_pays(weight: torch.Tensor, tokens: tuple[int, ...] = (1, 8)) -> bool:
    """Whether the packed kernel beats ``F.linear`` on this weight at decoding's token counts (timed, median of 7
    calls each)."""
    packed = pack_weight(weight)
    for n in tokens:
        x = torch.randn(1, n, weight.shape[1], dtype=weight.dtype)
        stock = median_ms(lambda x=x: F.linear(x, weight))
        fast = median_ms(lambda x=x: packed_linear(x, packed, None))
        if fast > 0.95 * stock:
            logger.info(
                "packed %s linear not faster here (%d tokens: %.3f ms vs %.3f ms)", weight.dtype, n, fast, stock
            )
            return False
    return True


def available_memory_bytes() -> int | None:
    """``MemAvailable`` of ``/proc/meminfo`` (Linux), or None where it cannot be read."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def pack_linear_weights(model: torch.nn.Module, check_speed: bool = True) -> int:
    """Pack every bf16 and fp32 CPU ``nn.Linear`` of ``model`` in place (see the module docstring); returns how many.

    Layers of each dtype are packed together, or not at all: nothing happens to them where the ops are
    missing, where their packed copy would not fit in half of the available memory or, with ``check_speed``,
    where the packed kernel does not measure faster on the largest weight of that dtype. Calling it again repacks.
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"pack_linear_weights takes a torch.nn.Module (a loaded model), got {type(model).__name__}.")
    count = 0
    for dtype in PACKED_DTYPES:
        layers = [m for m in _linears(model) if can_pack(m.weight) and m.weight.dtype == dtype]
        if not layers or not packing_available(dtype):
            continue
        new_bytes = sum(m.weight.nbytes for m in layers if not isinstance(m, PackedLinear) or m.packed is None)
        available = available_memory_bytes()
        if available is not None and new_bytes > available // 2:
            logger.warning(
                "not packing %d %s linear weights: their packed copy (%.1f GB) would not fit in half of "
                "the available memory (%.1f GB); forwards use the stock kernels",
                len(layers),
                dtype,
                new_bytes / 1e9,
                available / 1e9,
            )
            continue
        if check_speed and not packing_pays(max((m.weight for m in layers), key=torch.Tensor.numel)):
            continue
        for layer in layers:
            if not isinstance(layer, PackedLinear):
                layer.__class__ = PackedLinear
            layer.packed, layer.packed_from, layer.packed_enabled = None, None, True  # (re)pack from the current weight
            layer._fresh_packed()
        logger.info("packed %d %s linear weights for oneDNN", len(layers), dtype)
        count += len(layers)
    return count


def unpack_linear_weights(model: torch.nn.Module) -> int:
    """Undo :func:`pack_linear_weights`: plain ``nn.Linear`` layers again, packed copies freed; returns how many."""
    count = 0
    for layer in _linears(model):
        if isinstance(layer, PackedLinear):
            del layer.packed, layer.packed_from, layer.packed_enabled
            layer.__class__ = torch.nn.Linear
            count += 1
    return count


def is_packed(model: torch.nn.Module) -> bool:
    return any(isinstance(m, PackedLinear) for m in model.modules())


@contextlib.contextmanager
def stock_linear(model: torch.nn.Module) -> Iterator[None]:
    """Run ``model``'s packed layers through plain ``F.linear`` inside the block (to time the stock kernels)."""
    layers = [m for m in model.modules() if isinstance(m, PackedLinear)]
    before = [m.packed_enabled for m in layers]
    for m in layers:
        m.packed_enabled = False
    try:
        yield
    finally:
        for m, flag in zip(layers, before):
            m.packed_enabled = flag
