"""Write docs/cli.md from the CLI's own parser: ``python docs/gen_cli.py`` (``--check`` fails if it is stale).

Runs ``python -m adaflash_hf.cli <command> --help`` for every registered command, with a fixed terminal
width, so the page is the same on every machine and a second run changes nothing.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "cli.md"
HEADER = """# CLI reference

`adaflash COMMAND --help` prints the same text. This page is generated from the parser by
`python docs/gen_cli.py`; do not edit it by hand.

Every command prints its help at once: nothing heavy (torch, transformers) is imported until a command runs.
`--dtype` is `auto` everywhere (bf16 on CUDA or where this CPU's bf16 matmuls measure faster, else fp32), `bf16`,
`fp16` or `fp32`; only `soak-opd`, which compares every output bit for bit, defaults to `fp32`. A bad value or a
missing file prints one `error:` line and exits with status 2; add `--debug` for the traceback.

Common commands:

```bash
adaflash generate --prompt "Write a haiku about caches." --max-new-tokens 64 --compare-plain
adaflash generate --target qwen2.5-coder-1.5b --drafter path/to/drafter --temperature 0.7
adaflash generate --sources suffix,datastore --tree-nodes 0   # some draft sources only, one candidate per round
adaflash bench --target smollm2-135m \\
    --methods target,adaflash,adaflash-drafter,adaflash-suffix,prompt-lookup --json bench.json
adaflash profile --target smollm2-135m          # where one round's time goes, against a plain decode step
adaflash generate-data --data-dir data/smollm2-135m  # the target's own responses to training prompts (resumable)
adaflash prepare-drafter --drafter auto --data-dir data/smollm2-135m \\
    --output-dir my-drafter   # draft vocabulary + datastore
adaflash serve --port 8000                      # OpenAI-compatible server (continuous batching)
adaflash export smollm2-135m smollm2-135m-dflash   # DFlash layout for vLLM / SGLang, with the lines that serve it
adaflash bench --concurrency 1,4,8,16,32 --max-new-tokens 64   # served throughput at several loads
adaflash bench --concurrency 8,16 --repeats 3 \\
    --prompts my_prompts.jsonl   # your prompts; 3 interleaved passes per level
```
"""


def _help(*args: str) -> str:
    env = {**os.environ, "COLUMNS": "100", "NO_COLOR": "1", "PYTHON_COLORS": "0", "PYTHONPATH": str(ROOT)}
    result = subprocess.run(
        [sys.executable, "-m", "adaflash_hf.cli", *args, "--help"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return result.stdout.rstrip() + "\n"


def render() -> str:
    sys.path.insert(0, str(ROOT))
    from adaflash_hf.cli import COMMANDS

    parts = [HEADER, "## adaflash\n", "```text\n" + _help() + "```\n"]
    for name in COMMANDS:
        parts += [f"## adaflash {name}\n", "```text\n" + _help(name) + "```\n"]
    return "\n".join(parts)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if docs/cli.md differs from the parser's help")
    args = parser.parse_args()
    text = render()
    if args.check:
        current = PAGE.read_text() if PAGE.is_file() else ""
        if current != text:
            print(f"{PAGE} is stale: run python docs/gen_cli.py", file=sys.stderr)
            return 1
        return 0
    if not PAGE.is_file() or PAGE.read_text() != text:
        PAGE.write_text(text)
        print(f"wrote {PAGE}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
