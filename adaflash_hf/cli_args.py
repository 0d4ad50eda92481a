"""Command lines from config dataclasses and back: one ``--flag`` per field, typed and with its help text.

The dataclasses validate themselves in ``__post_init__``, so the command line and the Python API
reject the same values with the same messages. The fields every command shares (target, drafter,
dtype, CPU threads, seed, prompt set, JSON output, host and port) come from the factories here, so
they read the same everywhere and show up in the same help groups (``metadata["group"]``).

Light on purpose (no torch or transformers at import), so ``adaflash --help`` and ``adaflash <command>
--help`` stay fast: this is why it is argparse rather than transformers' ``HfArgumentParser``, whose
module imports transformers.
"""

from __future__ import annotations

import argparse
import dataclasses
import shlex
import socket
import types
import typing
from dataclasses import field

from .targets import PRESETS

MODEL_GROUP = "target and drafter"
OUTPUT_GROUP = "prompts and output"
DTYPES = ("auto", "bf16", "fp16", "fp32")
DTYPE_HELP = (
    "auto (bf16 on CUDA or where this CPU's bf16 matmuls measure faster than fp32, else fp32), bf16, "
    "fp16 (GPUs without bf16) or fp32 (bit-exact comparisons)"
)


def dtype_field(subject: str = "the target", default: str = "auto") -> typing.Any:
    """A dtype dataclass field: the same choices, default (``auto``) and help text in every command.

    Only a command whose result depends on bit-exact outputs (the soak compares every output with
    the target's own) passes another ``default``.
    """
    return field(
        default=default,
        metadata={"help": f"dtype of {subject}: {DTYPE_HELP}.", "choices": DTYPES, "group": MODEL_GROUP},
    )


def target_field(default: str, note: str = "") -> typing.Any:
    """The target: a preset, a local folder, a .gguf file or a Hub id; ``note`` adds what this command does with it."""
    help_text = f"Target: a preset ({', '.join(PRESETS)}), a local folder, a .gguf file or a Hub id"
    return field(
        default=default, metadata={"help": f"{help_text}{f' ({note})' if note else ''}.", "group": MODEL_GROUP}
    )


DRAFTER_HELP = (
    "'auto' (the drafter bundled for the preset target), 'fresh' (untrained, sized for the target), "
    "a local folder or a Hub id"
)


def drafter_field(default: str = "auto", help_text: str = DRAFTER_HELP) -> typing.Any:
    """The drafter, with the standard choices unless a command says what it does with it (``help_text``)."""
    return field(default=default, metadata={"help": f"{help_text}.", "group": MODEL_GROUP})


def num_threads_field(note: str = "") -> typing.Any:
    """torch CPU threads, default None (torch's choice); ``note`` adds where the count matters."""
    return field(
        default=None, metadata={"help": f"torch CPU threads (default: torch's choice){note}.", "group": MODEL_GROUP}
    )


def seed_field(of: str, default: int = 0) -> typing.Any:
    """A seed, with what it seeds."""
    return field(default=default, metadata={"help": f"Seed of {of}."})


def eval_prompts_field() -> typing.Any:
    """The prompt set of a benchmark: the presets' held-out prompts, or a user JSONL file."""
    return field(
        default="eval",
        metadata={
            "help": "'eval' (the held-out preset prompts of --domains) or a JSONL file of {prompt, domain} lines.",
            "group": OUTPUT_GROUP,
        },
    )


def domains_field(default: str) -> typing.Any:
    """The domains of the held-out preset prompts a benchmark reads."""
    return field(
        default=default,
        metadata={"help": "Comma-separated domains of the held-out preset prompts.", "group": OUTPUT_GROUP},
    )


def json_field(default: str, what: str = "the JSON results") -> typing.Any:
    """Where a command writes its JSON."""
    return field(default=default, metadata={"help": f"Where to write {what}.", "group": OUTPUT_GROUP})


def host_field(what: str) -> typing.Any:
    """The address a server binds: this machine only by default."""
    return field(
        default="127.0.0.1",
        metadata={
            "help": f"Address to bind: 127.0.0.1 serves this machine only; 0.0.0.0 exposes {what} to the network."
        },
    )


def port_field(default: int) -> typing.Any:
    """The TCP port a server listens on."""
    return field(default=default, metadata={"help": "TCP port."})


def check_choice(name: str, value, choices: typing.Sequence) -> None:
    """Raise a ValueError naming ``name`` and the allowed values when ``value`` is not one of ``choices``."""
    if value not in choices:
        raise ValueError(f"{name} {value!r} is not allowed: choose one of {', '.join(map(str, choices))}.")


def _field_default(f: dataclasses.Field):
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return dataclasses.MISSING


def add_dataclass_arguments(parser: argparse.ArgumentParser, cls) -> None:
    """One ``--flag`` per dataclass field, typed from its annotation, with the field's help text.

    The default is appended to the help once, unless the help text already says what it is; a
    field's ``metadata["choices"]`` become argparse choices, and fields with the same ``metadata["group"]``
    share a help section. A field with ``metadata["positional"]`` (and no default) is a positional argument
    named after it in capitals (``drafter`` -> ``DRAFTER``).
    """
    hints = typing.get_type_hints(cls)
    groups: dict[str, argparse._ArgumentGroup] = {}
    for f in dataclasses.fields(cls):
        group = f.metadata.get("group")
        if group is not None and group not in groups:
            groups[group] = parser.add_argument_group(group)
        container = parser if group is None else groups[group]
        flag = "--" + f.name.replace("_", "-")
        kind = hints[f.name]
        if typing.get_origin(kind) in (typing.Union, types.UnionType):  # Optional[X] -> X
            kind = next(a for a in typing.get_args(kind) if a is not type(None))
        default = _field_default(f)
        required = default is dataclasses.MISSING
        help_text = f.metadata.get("help", "")
        if not required and default is not None and "default" not in help_text:
            shown = " ".join(map(str, default)) if isinstance(default, list | tuple) else default
            help_text += f" (default: {shown})"
        help_text = help_text.replace("%", "%%")
        default = None if required else default
        if f.metadata.get("positional"):
            container.add_argument(f.name, metavar=f.name.upper(), type=kind, help=help_text)
        elif kind is bool:
            container.add_argument(flag, action=argparse.BooleanOptionalAction, default=default, help=help_text)
        elif typing.get_origin(kind) in (list, tuple):
            container.add_argument(flag, nargs="+", type=typing.get_args(kind)[0], default=default, help=help_text)
        else:
            container.add_argument(
                flag, type=kind, default=default, required=required, choices=f.metadata.get("choices"), help=help_text
            )


def dataclass_from_args(cls, args: argparse.Namespace):
    """The dataclass ``cls`` built (and so validated) from parsed arguments."""
    return cls(**{f.name: getattr(args, f.name) for f in dataclasses.fields(cls)})


def command_line(command: str, config, values: dict | None = None) -> str:
    """The ``adaflash <command>`` line that rebuilds dataclass ``config`` (non-default fields only).

    With ``values``, ``config`` is the dataclass itself and ``values`` its fields as recorded (e.g. a run's
    recipe): the line is rendered without building, and so without validating, a config; keys that are no
    longer fields are left out."""
    parts = [f"adaflash {command}"]
    for f in dataclasses.fields(config):
        if values is not None and f.name not in values:
            continue
        value = values[f.name] if values is not None else getattr(config, f.name)
        if value == _field_default(f):
            continue
        flag = "--" + f.name.replace("_", "-")
        if f.metadata.get("positional"):
            parts.append(_shell_word(value))
        elif isinstance(value, bool):
            parts.append(flag if value else "--no-" + f.name.replace("_", "-"))
        elif isinstance(value, list | tuple):
            parts.append(f"{flag} " + " ".join(map(str, value)))
        elif value is not None:
            parts.append(f"{flag} {_shell_word(value)}")
    return " ".join(parts)


def _shell_word(value) -> str:
    """``value`` quoted for a POSIX shell, a leading ``~/`` left outside the quotes so the shell still expands it."""
    text = str(value)
    if text.startswith("~/"):
        return "~/" + shlex.quote(text[2:]) if text[2:] else "~/"
    return shlex.quote(text)


def encode_prompt(tokenizer, prompt: str, raw: bool = False):
    """(1, L) LongTensor of ``prompt`` as the target sees it (see :func:`adaflash_hf.prompting.chat_prompt_ids`)."""
    import torch

    from .prompting import chat_prompt_ids

    return torch.tensor([chat_prompt_ids(tokenizer, prompt, raw=raw)], dtype=torch.long)


def check_port_free(host: str, port: int) -> None:
    """Raise a ValueError saying what to do when ``host:port`` cannot be listened on."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server does: TIME_WAIT is no conflict
        try:
            probe.bind((host, port))
        except OSError as error:
            raise ValueError(
                f"cannot listen on {host}:{port} ({error.strerror or error}): pick a free port with "
                f"--port (e.g. --port {port + 1 if port < 65535 else 7860}) or a local address with --host."
            ) from None
