"""Where the accepted drafts came from: the hybrid engine against each draft source alone, on one prompt.

    python examples/draft_sources.py
    python examples/draft_sources.py --target qwen2.5-coder-1.5b --max-new-tokens 96 --dtype fp32

One row per configuration: tokens per second and speed-up over plain `target.generate`, tau, whether
the output equals the plain one (always in fp32; in bf16 a near-tie may round the other way), and
how many rounds drafted from each source, with the drafts accepted per round. The datastore row
appears when the drafter ships a datastore (the bundled SmolLM2 drafter does).
"""

import argparse
import time

from adaflash_hf import DraftingConfig, DraftingState, generate, load_drafter, load_target


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="smollm2-135m", help="a preset, a local folder, a .gguf file or a Hub id")
    parser.add_argument("--drafter", default="auto", help="'auto' (the target's bundled drafter), a folder or a Hub id")
    parser.add_argument("--dtype", default="auto", choices=["auto", "bf16", "fp16", "fp32"])
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument(
        "--prompt",
        default="Write a Python class for a bank account with deposit, withdraw and a history of transactions.",
    )
    args = parser.parse_args(argv)

    target, tokenizer = load_target(args.target, dtype=args.dtype)
    drafter = load_drafter(args.drafter, target, target_name=args.target)  # with its datastore, if it ships one
    inputs = tokenizer.apply_chat_template(
        [{"role": "user", "content": args.prompt}], add_generation_prompt=True, return_tensors="pt", return_dict=True
    ).to(target.device)
    ids, prompt_len = inputs["input_ids"], inputs["input_ids"].shape[1]
    generate(target, drafter, ids, max_new_tokens=8, drafting_state=DraftingState())  # warm-up
    start = time.perf_counter()
    plain = target.generate(
        **inputs, max_new_tokens=args.max_new_tokens, do_sample=False, pad_token_id=tokenizer.pad_token_id
    )
    plain_tps = (plain.shape[1] - prompt_len) / (time.perf_counter() - start)
    plain_answer = plain[0, prompt_len:].tolist()

    configurations = {
        "hybrid": DraftingConfig(),
        "drafter": DraftingConfig.only("drafter"),
        "suffix": DraftingConfig.only("suffix"),
    }
    if getattr(drafter, "adaflash_datastore", None) is not None:
        configurations["datastore"] = DraftingConfig.only("datastore")
    print(
        f"{'configuration':<13} {'tok/s':>6} {'speed-up':>8} {'tau':>5} {'same':>4}  rounds per source (drafts "
        "accepted per round)"
    )
    print(f"{'plain':<13} {plain_tps:>6.1f} {1:>7.2f}x {1:>5.2f} {'yes':>4}")
    for name, drafting in configurations.items():
        start = time.perf_counter()  # a fresh DraftingState: nothing learnt from the other runs
        out = generate(
            target, drafter, ids, max_new_tokens=args.max_new_tokens, drafting=drafting, drafting_state=DraftingState()
        )
        tps = out.num_new_tokens[0] / (time.perf_counter() - start)
        same = out.sequences[0, prompt_len : prompt_len + out.num_new_tokens[0]].tolist() == plain_answer
        sources = ", ".join(f"{s} {n} ({a / n:.2f})" for s, (n, a) in sorted(out.stats.source_counts().items()))
        print(
            f"{name:<13} {tps:>6.1f} {tps / plain_tps:>7.2f}x {out.mean_accepted_length:>5.2f} "
            f"{'yes' if same else 'no':>4}  {sources}"
        )


if __name__ == "__main__":
    main()
