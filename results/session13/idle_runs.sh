#!/bin/bash
# Session 13: the measurements that need an idle machine, one after another (logs in results/session13/).
# 1. the Qwen drafter with the grown datastore and a fresh acceptance prior (weights and vocabulary kept)
# 2. a quick A/B of it against the shipped Qwen drafter, 3. the full Qwen bench, 4. the concurrency bench,
# 5. the SmolLM2 batch-1 bench.
set -e
cd "$(dirname "$0")/../.."
. .venv/bin/activate
out=results/session13
new=${NEW_QWEN:-/tmp/qwen-new}
if [ ! -f "$new/datastore.safetensors" ]; then
  adaflash prepare-drafter --target qwen2.5-coder-1.5b --drafter auto --output-dir "$new" --data-dir data/qwen2.5-coder-1.5b \
    --keep-vocab --acceptance-prompts 24 --acceptance-tokens 64 > $out/prepare_qwen.txt 2> $out/prepare_qwen.log
fi
for name in shipped new; do
  drafter=$([ $name = shipped ] && echo adaflash_hf/bundled/qwen2.5-coder-1.5b || echo "$new")
  adaflash bench --target qwen2.5-coder-1.5b --drafter "$drafter" --num-prompts 1 --max-new-tokens 96 --num-threads 2 \
    --dtype bf16 --methods target,adaflash --json $out/qwen_ab_$name.json --plot "" > $out/qwen_ab_$name.txt 2> $out/qwen_ab_$name.log
done
echo "ab done $(date)"
