"""Where the accepted drafts came from: the hybrid engine against each draft source alone, on one prompt.

    python examples/draft_sources.py --target smollm2-135m --max-new-tokens 128
"""

import argparse
import time

import torch

from adaflash_hf import DraftingConfig, DraftingState, generate, load_drafter, load_target


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="smollm2-135m")
    parser.add_argument("--drafter", default="auto")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--prompt", default="Write a Python class for a bank account with deposit, withdraw and a history of transactions.")
    args = parser.parse_args()

    target, tokenizer = load_target(args.target)
    drafter = load_drafter(args.drafter, target, target_name=args.target)  # with its datastore, if it ships one
    ids = tokenizer.apply_chat_template([{"role": "user", "content": args.prompt}], add_generation_prompt=True,
                                        return_tensors="pt", return_dict=True)["input_ids"].to(target.device)
    generate(target, drafter, ids, max_new_tokens=8, drafting_state=DraftingState())  # warm-up
    start = time.perf_counter()
    plain = target.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=args.max_new_tokens, do_sample=False,
                            pad_token_id=tokenizer.pad_token_id)
    plain_tps = (plain.shape[1] - ids.shape[1]) / (time.perf_counter() - start)
    print(f"{'configuration':<12} {'tok/s':>7} {'speed-up':>9} {'tau':>6}  rounds per source (drafts accepted per round)")
    for name, drafting in [("hybrid", DraftingConfig()), ("drafter", DraftingConfig.only("drafter")),
                           ("suffix", DraftingConfig.only("suffix")), ("datastore", DraftingConfig.only("datastore"))]:
        if name == "datastore" and getattr(drafter, "adaflash_datastore", None) is None:
            continue
        start = time.perf_counter()
        out = generate(target, drafter, ids, max_new_tokens=args.max_new_tokens, drafting=drafting, drafting_state=DraftingState())
        tps = out.num_new_tokens[0] / (time.perf_counter() - start)
        sources = ", ".join(f"{s} {n} ({a / n:.2f})" for s, (n, a) in sorted(out.stats.source_counts().items()))
        print(f"{name:<12} {tps:>7.1f} {tps / plain_tps:>8.2f}x {out.mean_accepted_length:>6.2f}  {sources}")


if __name__ == "__main__":
    main()
