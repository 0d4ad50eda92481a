"""Train a drafter for a target that ships without one (default: Qwen2.5-Coder-0.5B), then generate with it.

    python examples/train_drafter_for_another_target.py                       # one hour of training
    python examples/train_drafter_for_another_target.py --target my/local-model --output-dir runs/mine
    python examples/train_drafter_for_another_target.py --max-steps 5 --eval-prompts-per-domain 2 \\
        --self-gen-prompts-per-domain 2 --gen-max-new-tokens 24 --corpus-limit-per-domain 8 --seq-len 128 \\
        --engine-eval-prompts 0 --max-new-tokens 32                           # a smoke run of a few minutes

`train_drafter` runs the DFlash recipe on the frozen target (README, "Training a drafter"): it has the
target answer training prompts itself, builds a fresh drafter sized for it with
`AdaFlashDrafter.from_target` (one draft layer reading five target layers, block 8), trains it on
that and on teacher-forced corpus text, checkpoints (a rerun resumes), logs held-out tau and saves
the drafter to `<output-dir>/drafter`. Every `adaflash train-drafter` flag works here, with the same
meaning; this script only changes the defaults of `--target`, `--output-dir` and `--max-minutes`.
The equivalent command line:

    adaflash train-drafter --target qwen2.5-coder-0.5b --output-dir runs/qwen2.5-coder-0.5b-drafter --max-minutes 60

Then the new drafter is loaded like any other (`load_drafter(folder, target)`) and drafts alone for
one prompt; tau says how many tokens each target forward produced with it.
"""

import argparse
import logging
import sys

from adaflash_hf import DraftingConfig, DraftingState, FixedVerifyLength, generate, load_drafter, load_target
from adaflash_hf.cli_args import add_dataclass_arguments, dataclass_from_args
from adaflash_hf.training.trainer import TrainDrafterConfig, train_drafter

DEFAULTS = ["--target", "qwen2.5-coder-0.5b", "--output-dir", "runs/qwen2.5-coder-0.5b-drafter", "--max-minutes", "60"]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_dataclass_arguments(parser, TrainDrafterConfig)  # the flags of `adaflash train-drafter`
    parser.add_argument("--prompt", default="Write a Python function that merges two sorted lists.")
    parser.add_argument("--max-new-tokens", type=int, default=96)
    args = parser.parse_args(DEFAULTS + (sys.argv[1:] if argv is None else argv))  # a flag given twice: the later wins
    config = dataclass_from_args(TrainDrafterConfig, args)
    logging.basicConfig(level=logging.INFO, format="%(message)s")  # the run logs its data sizes and held-out tau

    # 1. Train: the target is loaded once and stays frozen; the result is a drafter folder.
    target, tokenizer = load_target(config.target, dtype=config.target_dtype)
    drafter_dir = train_drafter(config, target, tokenizer)
    print(
        f"drafter saved to {drafter_dir} (held-out tau and the run's curves: {drafter_dir}/training_summary.json, "
        f"{config.output_dir}/curves.png)"
    )

    # 2. Load it like any other drafter folder.
    drafter = load_drafter(str(drafter_dir), target)
    shape = drafter.config
    print(
        f"drafter: {shape.num_hidden_layers} layer(s), block {shape.block_size}, reads target layers "
        f"{shape.target_layer_ids}, {sum(p.numel() for p in drafter.parameters()) / 1e6:.1f} M parameters"
    )

    # 3. Generate, drafting from the new drafter alone and verifying its whole block, so tau measures it.
    inputs = tokenizer.apply_chat_template(
        [{"role": "user", "content": args.prompt}], add_generation_prompt=True, return_tensors="pt", return_dict=True
    ).to(target.device)
    out = generate(
        target,
        drafter,
        inputs["input_ids"],
        inputs["attention_mask"],
        max_new_tokens=args.max_new_tokens,
        drafting=DraftingConfig.only("drafter"),
        verify_policy=FixedVerifyLength(),
        drafting_state=DraftingState(),
    )
    prompt_len = inputs["input_ids"].shape[1]
    print(tokenizer.decode(out.sequences[0, prompt_len : prompt_len + out.num_new_tokens[0]], skip_special_tokens=True))
    print(
        f"\ntau {out.mean_accepted_length:.2f} with the new drafter alone; acceptance of drafts 1-4 "
        f"{[round(a, 2) for a in out.stats.position_acceptance(4)]}"
    )
    print(f"use it: adaflash generate --target {config.target} --drafter {drafter_dir}")


if __name__ == "__main__":
    main()
