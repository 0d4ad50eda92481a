"""`model.generate(..., assistant_model=drafter)` with an AdaFlash drafter: one `enable_adaflash` call, then
stock generate.

    python examples/generate.py
    python examples/generate.py --prompt "Write a haiku about caches." --temperature 0.7
    python examples/generate.py --target qwen2.5-coder-1.5b --dtype fp32

Prints the answer, then tau (tokens per target forward, counting the target's own bonus token) and
where the accepted drafts came from, read from `last_generation_stats(target)`. Greedy decoding in
fp32 gives the target's own greedy answer token for token; with `--temperature` it is a sample from
the target's distribution.
"""

import argparse

from adaflash_hf import enable_adaflash, last_generation_stats, load_drafter, load_target


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", default="smollm2-135m", help="a preset, a local folder, a .gguf file or a Hub id")
    parser.add_argument("--drafter", default="auto", help="'auto' (the target's bundled drafter), a folder or a Hub id")
    parser.add_argument("--dtype", default="auto", choices=["auto", "bf16", "fp16", "fp32"])
    parser.add_argument("--prompt", default="Write a Python function that checks whether a string is a palindrome.")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--temperature", type=float, default=0.0, help="0 decodes greedily")
    args = parser.parse_args(argv)

    target, tokenizer = load_target(args.target, dtype=args.dtype)
    drafter = load_drafter(args.drafter, target, target_name=args.target)
    enable_adaflash(target)  # AdaFlash drafters now take AdaFlash's path; other assistants keep transformers' own

    inputs = tokenizer.apply_chat_template(
        [{"role": "user", "content": args.prompt}], add_generation_prompt=True, return_tensors="pt", return_dict=True
    ).to(target.device)
    sampling = {"do_sample": True, "temperature": args.temperature} if args.temperature > 0 else {"do_sample": False}
    out = target.generate(
        **inputs,
        assistant_model=drafter,
        max_new_tokens=args.max_new_tokens,
        pad_token_id=tokenizer.pad_token_id,
        **sampling,
    )
    print(tokenizer.decode(out[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True))

    stats = last_generation_stats(target)
    sources = ", ".join(
        f"{source} {rounds} rounds ({accepted} drafts accepted)"
        for source, (rounds, accepted) in sorted(stats.source_counts().items())
    )
    print(f"\ntau {stats.mean_accepted_length:.2f}, accept rate {stats.accept_rate:.2f}; {sources}")


if __name__ == "__main__":
    main()
