"""A transformers text-generation pipeline accelerated by an AdaFlash drafter, streaming its answer.

    python examples/pipeline_chat.py
    python examples/pipeline_chat.py "Explain what a hash map is." --max-new-tokens 96

`enable_adaflash(target)` once, then `pipeline("text-generation", model=target, assistant_model=drafter)`
works as with any assistant model: chat messages in, the assistant's reply out, streamers and
generation arguments passed through. Prints tau from `last_generation_stats` at the end.
"""

import argparse

from transformers import TextStreamer, pipeline

from adaflash_hf import enable_adaflash, last_generation_stats, load_drafter, load_target


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("question", nargs="?", default="Explain what a hash map is.")
    parser.add_argument("--target", default="smollm2-135m", help="a preset, a local folder, a .gguf file or a Hub id")
    parser.add_argument("--drafter", default="auto", help="'auto' (the target's bundled drafter), a folder or a Hub id")
    parser.add_argument("--dtype", default="auto", choices=["auto", "bf16", "fp16", "fp32"])
    parser.add_argument("--max-new-tokens", type=int, default=128)
    args = parser.parse_args(argv)

    target, tokenizer = load_target(args.target, dtype=args.dtype)
    drafter = load_drafter(args.drafter, target, target_name=args.target)
    enable_adaflash(target)
    chat = pipeline("text-generation", model=target, tokenizer=tokenizer, assistant_model=drafter)
    chat(
        [{"role": "user", "content": args.question}],
        max_new_tokens=args.max_new_tokens,
        do_sample=False,
        pad_token_id=tokenizer.pad_token_id,
        streamer=TextStreamer(tokenizer, skip_prompt=True, skip_special_tokens=True),
    )
    print(f"\ntau {last_generation_stats(target).mean_accepted_length:.2f}")


if __name__ == "__main__":
    main()
