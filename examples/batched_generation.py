"""Batched, lossless speculative decoding with `adaflash_hf.generate`: a ragged batch whose rows advance independently.

    python examples/batched_generation.py
    python examples/batched_generation.py --target qwen2.5-coder-1.5b --max-new-tokens 64

Prompts of different lengths are left-padded into one batch; every round each row keeps as many of
its drafts as the target accepts, and a finished row leaves the batch. Prints each answer, then tau,
the accept rate and the acceptance of the first draft positions.
"""

import argparse

from adaflash_hf import generate, load_drafter, load_target

QUESTIONS = [
    "Write a Python function that returns the n-th Fibonacci number.",
    "A train travels 60 km in 45 minutes. What is its speed in km/h?",
    "Give three tips for writing clear commit messages.",
    "What does the `yield` keyword do in Python?",
]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="smollm2-135m", help="a preset, a local folder, a .gguf file or a Hub id")
    parser.add_argument("--drafter", default="auto", help="'auto' (the target's bundled drafter), a folder or a Hub id")
    parser.add_argument("--dtype", default="auto", choices=["auto", "bf16", "fp16", "fp32"])
    parser.add_argument("--max-new-tokens", type=int, default=64)
    args = parser.parse_args(argv)

    target, tokenizer = load_target(args.target, dtype=args.dtype)  # sets left padding and a pad token
    drafter = load_drafter(args.drafter, target, target_name=args.target)
    texts = [
        tokenizer.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True, tokenize=False)
        for q in QUESTIONS
    ]
    batch = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False).to(target.device)
    out = generate(target, drafter, batch.input_ids, batch.attention_mask, max_new_tokens=args.max_new_tokens)

    width = batch.input_ids.shape[1]  # out.sequences: (batch, width + new), the answers right-padded
    for question, row, n in zip(QUESTIONS, out.sequences, out.num_new_tokens):
        print(f"### {question}\n{tokenizer.decode(row[width : width + n], skip_special_tokens=True)}\n")
    print(
        f"tau {out.mean_accepted_length:.2f}, accept rate {out.accept_rate:.2f}, rounds {out.stats.num_rounds}, "
        f"acceptance of drafts 1-4 {[round(a, 2) for a in out.stats.position_acceptance(4)]}"
    )


if __name__ == "__main__":
    main()
