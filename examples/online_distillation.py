"""On-policy distillation while you generate: a LoRA adapter on the drafter learns from live requests as they
are served.

    python examples/online_distillation.py
    python examples/online_distillation.py --requests 60 --duty-cycle 0.25 \\
        --publish-dir opd-adapters --merged-dir merged-drafter
    python examples/online_distillation.py --dtype fp32 --check   # also compare every answer with the target's own

Each request is an ordinary `target.generate(..., assistant_model=drafter)` call. `AdaFlashOPD.attach()`
makes those calls record what the target verified (no extra target pass); between rounds, within the
duty cycle (on a CPU in the same thread; OPDConfig.worker), the trainer fits LoRA adapters on the drafter
to the recordings, publishes a version to `--publish-dir` only when it
beats the serving one on held-out recordings, and the engine swaps it in between rounds. Every
`--report-every` requests a line shows tokens per second, tau of the last requests and the OPD status
(adapter version, training steps, the last held-out check). At the end the newest published adapter
can be merged into a plain drafter folder (`--merged-dir`) that loads like any drafter.
"""

import argparse
import time

from adaflash_hf import enable_adaflash, last_generation_stats, load_drafter, load_target
from adaflash_hf.online import AdaFlashOPD, OPDConfig, merge_adapter

# Requests of one style (prose fiction, a domain the bundled drafters never trained on), cycled.
PROMPTS = [
    "Continue the story: The carriage stopped at the gate of the old house, "
    "and Miss Bennet stepped down into the rain.",
    "Write the next paragraph of a novel in which two sisters argue about a letter from their cousin.",
    "Describe a country ball in the style of a nineteenth-century novel.",
    "Continue the story: Mr. Darcy had not expected to find anyone in the library at that hour.",
    "Write a short scene in which a young woman refuses a proposal of marriage, politely but firmly.",
    "Continue the story: The morning after the storm, the whole village gathered at the church to hear the news.",
]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", default="smollm2-135m", help="a preset, a local folder, a .gguf file or a Hub id")
    parser.add_argument("--drafter", default="auto", help="'auto' (the target's bundled drafter), a folder or a Hub id")
    parser.add_argument("--dtype", default="auto", choices=["auto", "bf16", "fp16", "fp32"])
    parser.add_argument("--requests", type=int, default=24, help="live requests to serve (the prompts above, cycled)")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--duty-cycle", type=float, default=1.0, help="share of wall time the trainer may compute")
    parser.add_argument("--lr", type=float, default=OPDConfig.lr)
    parser.add_argument(
        "--min-trajectories",
        type=int,
        default=OPDConfig.min_trajectories,
        help="requests recorded before training starts",
    )
    parser.add_argument(
        "--steps-per-version",
        type=int,
        default=OPDConfig.steps_per_version,
        help="training steps between held-out checks (and publications)",
    )
    parser.add_argument(
        "--publish-dir", default="opd-adapters", help="where each published version goes (v000N/ + LATEST)"
    )
    parser.add_argument(
        "--merged-dir", default=None, help="merge the newest published adapter into a drafter saved here"
    )
    parser.add_argument("--report-every", type=int, default=4)
    parser.add_argument(
        "--check", action="store_true", help="also run plain generate and compare (use with --dtype fp32)"
    )
    args = parser.parse_args(argv)
    if args.requests < 1 or args.report_every < 1:
        parser.error("--requests and --report-every must be >= 1")

    target, tokenizer = load_target(args.target, dtype=args.dtype)
    drafter = load_drafter(args.drafter, target, target_name=args.target)
    enable_adaflash(target)
    config = OPDConfig(
        duty_cycle=args.duty_cycle,
        lr=args.lr,
        min_trajectories=args.min_trajectories,
        steps_per_version=args.steps_per_version,
        publish_dir=args.publish_dir,
    )
    opd = AdaFlashOPD(target, drafter, config).attach().start()  # attach: generate calls on `target` are recorded

    tokens, seconds, forwards, mismatches = 0, 0.0, 0, 0
    try:
        for request in range(1, args.requests + 1):
            prompt = PROMPTS[(request - 1) % len(PROMPTS)]
            inputs = tokenizer.apply_chat_template(
                [{"role": "user", "content": prompt}], add_generation_prompt=True, return_tensors="pt", return_dict=True
            ).to(target.device)
            start = time.perf_counter()
            out = target.generate(
                **inputs,
                assistant_model=drafter,
                max_new_tokens=args.max_new_tokens,
                do_sample=False,
                pad_token_id=tokenizer.pad_token_id,
            )
            seconds += time.perf_counter() - start
            new = out.shape[1] - inputs["input_ids"].shape[1]
            tokens += new
            forwards += round(new / last_generation_stats(target).mean_accepted_length)
            if args.check:
                plain = target.generate(
                    **inputs, max_new_tokens=args.max_new_tokens, do_sample=False, pad_token_id=tokenizer.pad_token_id
                )
                mismatches += int(not plain.equal(out))
            if request % args.report_every == 0 or request == args.requests:
                status = opd.status()
                check = status["last_check"] or {}
                print(
                    f"request {request:>4}: {tokens / seconds:6.1f} tok/s, tau {tokens / max(forwards, 1):.2f} | "
                    f"adapter v{status['adapter_version']}, {status['steps']} steps, "
                    f"held-out tau {check.get('candidate_tau', '-')} vs serving {check.get('serving_tau', '-')}, "
                    f"recorded {status['buffer']['added']}",
                    flush=True,
                )
                tokens, seconds, forwards = 0, 0.0, 0
    finally:
        opd.stop()  # serving never waited for it; stopping waits for the current step

    status = opd.status()
    print(
        f"OPD {status['state']}: {status['published']} version(s) published, {status['swaps']} swapped in, "
        f"{status['steps']} training steps, errors: {status['errors'] or 'none'}"
    )
    if args.check:
        print(f"answers equal to the target's own: {args.requests - mismatches}/{args.requests}")
    latest = status["published_version"]
    if status["published"] and args.merged_dir:
        base = load_drafter(args.drafter, target, target_name=args.target)  # a fresh drafter without LoRA layers
        merge_adapter(base, f"{args.publish_dir}/v{latest:04d}").save_pretrained(args.merged_dir)
        print(f"merged adapter v{latest} into {args.merged_dir}")


if __name__ == "__main__":
    main()
