"""Command lines from config dataclasses and back: one ``--flag`` per field, typed and with its help text.

The dataclasses validate themselves in ``__post_init__``, so the command line and the Python API
reject the same values with the same messages. Light on purpose (no torch or transformers at
import), so ``adaflash --help`` stays fast.
"""

from __future__ import annotations

import argparse
import dataclasses
import shlex
import socket
import types
import typing
from dataclasses import field

DTYPES = ("auto", "bf16", "fp16", "fp32")
DTYPE_HELP = ("auto (bf16 on CUDA or where this CPU's bf16 matmuls measure faster than fp32, else fp32), bf16, "
              "fp16 (GPUs without bf16) or fp32 (bit-exact comparisons)")


def dtype_field(subject: str = "the target", default: str = "auto") -> typing.Any:
    """A dtype dataclass field: the same choices, default (``auto``) and help text in every command.

    Only a command whose result depends on bit-exact outputs (the soak compares every output with
    the target's own) passes another ``default``.
    """
    return field(default=default, metadata={"help": f"dtype of {subject}: {DTYPE_HELP}.", "choices": DTYPES})


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
    field's ``metadata["choices"]`` become argparse choices.
    """
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
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
        if kind is bool:
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=default, help=help_text)
        elif typing.get_origin(kind) in (list, tuple):
            parser.add_argument(flag, nargs="+", type=typing.get_args(kind)[0], default=default, help=help_text)
        else:
            parser.add_argument(flag, type=kind, default=default, required=required, choices=f.metadata.get("choices"),
                                help=help_text)


def dataclass_from_args(cls, args: argparse.Namespace):
    """The dataclass ``cls`` built (and so validated) from parsed arguments."""
    return cls(**{f.name: getattr(args, f.name) for f in dataclasses.fields(cls)})


def command_line(command: str, config) -> str:
    """The ``adaflash <command>`` line that rebuilds dataclass ``config`` (non-default fields only)."""
    parts = [f"adaflash {command}"]
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if value == _field_default(f):
            continue
        flag = "--" + f.name.replace("_", "-")
        if isinstance(value, bool):
            parts.append(flag if value else "--no-" + f.name.replace("_", "-"))
        elif isinstance(value, list | tuple):
            parts.append(f"{flag} " + " ".join(map(str, value)))
        elif value is not None:
            parts.append(f"{flag} {shlex.quote(str(value))}")
    return " ".join(parts)


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
            raise ValueError(f"cannot listen on {host}:{port} ({error.strerror or error}): pick a free port with "
                             f"--port (e.g. --port {port + 1 if port < 65535 else 7860}) or a local address with --host.") from None
