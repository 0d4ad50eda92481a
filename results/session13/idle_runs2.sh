#!/bin/bash
# Session 13, after idle_runs.sh: the full Qwen bench (drafter folder $QWEN), the concurrency bench and the SmolLM2
# batch-1 bench, one after another on the idle machine.
set -e
cd "$(dirname "$0")/../.."
. .venv/bin/activate
out=results/session13
adaflash bench --target qwen2.5-coder-1.5b --drafter "${QWEN:-auto}" --num-prompts 2 --max-new-tokens 96 --num-threads 2 --dtype bf16 \
  --methods target,adaflash,adaflash-suffix,prompt-lookup,assisted \
  --json $out/bench_qwen1.5b_amd.json --plot $out/bench_qwen1.5b_amd.png > $out/bench_qwen1.5b_amd.txt 2> $out/bench_qwen1.5b_amd.log
echo "qwen done $(date)"
adaflash bench --concurrency 1,4,8,16,32 --max-new-tokens 64 --dtype bf16 --num-threads 2 \
  --json $out/bench_concurrency_amd.json --plot $out/bench_concurrency_amd.png > $out/bench_concurrency_amd.txt 2> $out/bench_concurrency_amd.log
echo "concurrency done $(date)"
adaflash bench --num-prompts 8 --max-new-tokens 96 --num-threads 2 --dtype bf16 \
  --methods target,adaflash,adaflash-suffix,prompt-lookup \
  --json $out/bench_smollm2_amd.json --plot $out/bench_smollm2_amd.png > $out/bench_smollm2_amd.txt 2> $out/bench_smollm2_amd.log
echo "smollm2 done $(date)"
