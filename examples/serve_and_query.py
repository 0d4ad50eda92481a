"""The OpenAI-compatible server, started in-process and queried with the `openai` client: completions, chat, streaming.

    pip install -e '.[serve]' openai
    python examples/serve_and_query.py
    python examples/serve_and_query.py --target qwen2.5-coder-1.5b --max-tokens 96

The same server from the command line, and the same queries against it:

    adaflash serve --port 8000            # smollm2-135m + its bundled drafter on http://127.0.0.1:8000/v1
    curl http://127.0.0.1:8000/v1/chat/completions -H 'Content-Type: application/json' \\
        -d '{"model": "smollm2-135m", "messages": [{"role": "user", "content": "Hi!"}], "max_tokens": 32}'

Every response carries an extra `adaflash` field beside OpenAI's: the request's engine metrics (tau,
time to first token, time queued, rounds); a stream carries it in its last chunk. The server binds
to 127.0.0.1 and takes any API key (it has no authentication).
"""

import argparse

from openai import OpenAI

from adaflash_hf.serve import ServeArgs, build_scheduler
from adaflash_hf.serving.app import create_app
from adaflash_hf.serving.server import ServerThread


def describe(metrics: dict) -> str:
    """The response's ``adaflash`` field on one line: tau (mean_accepted_length), rounds, timings in seconds."""
    return "[adaflash] " + ", ".join(
        f"{key} {value:.3g}" if isinstance(value, float) else f"{key} {value}" for key, value in metrics.items()
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="smollm2-135m", help="a preset, a local folder, a .gguf file or a Hub id")
    parser.add_argument("--drafter", default="auto", help="'auto' (the target's bundled drafter), a folder or a Hub id")
    parser.add_argument("--dtype", default="auto", choices=["auto", "bf16", "fp16", "fp32"])
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--question", default="Write a Python function that reverses a linked list.")
    args = parser.parse_args(argv)

    # What `adaflash serve` does: load target and drafter into the continuous-batching scheduler (which
    # times the target's forwards at start-up), then serve the app; here from a thread, on a free port.
    scheduler = build_scheduler(ServeArgs(target=args.target, drafter=args.drafter, dtype=args.dtype))
    with ServerThread(create_app(scheduler)) as url:  # the app starts the scheduler, and stops it on exit
        client = OpenAI(base_url=f"{url}/v1", api_key="unused")
        model = client.models.list().data[0].id
        print(f"serving {model!r} at {url}/v1")

        print("\n## /v1/completions: plain text, continued")
        reply = client.completions.create(
            model=model, prompt="def fibonacci(n):", max_tokens=args.max_tokens, temperature=0
        )
        print(reply.choices[0].text)
        print(describe(reply.adaflash))

        messages = [{"role": "user", "content": args.question}]
        print("\n## /v1/chat/completions")
        reply = client.chat.completions.create(
            model=model, messages=messages, max_tokens=args.max_tokens, temperature=0
        )
        print(reply.choices[0].message.content)
        print(describe(reply.adaflash))

        print("\n## /v1/chat/completions, streamed")
        metrics = None
        for chunk in client.chat.completions.create(
            model=model, messages=messages, max_tokens=args.max_tokens, temperature=0, stream=True
        ):
            if chunk.choices and chunk.choices[0].delta.content:
                print(chunk.choices[0].delta.content, end="", flush=True)
            metrics = chunk.model_extra.get("adaflash", metrics)  # in the last chunk
        print()
        print(describe(metrics))
    print("\nserver stopped")


if __name__ == "__main__":
    main()
