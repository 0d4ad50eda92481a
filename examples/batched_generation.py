"""Batched, lossless speculative decoding with adaflash_hf.generate (rows advance independently).

    python examples/batched_generation.py --target smollm2-135m --max-new-tokens 64
"""

import argparse

from adaflash_hf import generate, load_drafter, load_target


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="smollm2-135m")
    parser.add_argument("--drafter", default="auto")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    args = parser.parse_args()

    target, tokenizer = load_target(args.target)
    drafter = load_drafter(args.drafter, target, target_name=args.target)
    questions = [
        "Write a Python function that returns the n-th Fibonacci number.",
        "A train travels 60 km in 45 minutes. What is its speed in km/h?",
        "Give three tips for writing clear commit messages.",
        "What does the `yield` keyword do in Python?",
    ]
    texts = [tokenizer.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True, tokenize=False)
             for q in questions]
    batch = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False).to(target.device)
    out = generate(target, drafter, batch.input_ids, batch.attention_mask, max_new_tokens=args.max_new_tokens)
    width = batch.input_ids.shape[1]
    for question, row, n in zip(questions, out.sequences, out.num_new_tokens):
        print(f"### {question}\n{tokenizer.decode(row[width: width + n], skip_special_tokens=True).strip()}\n")
    print(f"tau {out.mean_accepted_length:.2f}, accept rate {out.accept_rate:.2f}, rounds {out.stats.num_rounds}, "
          f"acceptance by position {[round(a, 2) for a in out.stats.position_acceptance(4)]}")


if __name__ == "__main__":
    main()
