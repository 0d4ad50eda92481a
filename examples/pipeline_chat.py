"""A transformers text-generation pipeline accelerated by an AdaFlash drafter, with streaming.

    python examples/pipeline_chat.py "Explain what a hash map is."
"""

import sys

from transformers import TextStreamer, pipeline

from adaflash_hf import enable_adaflash, last_generation_stats, load_drafter, load_target

target, tokenizer = load_target("smollm2-135m")
drafter = load_drafter("auto", target, target_name="smollm2-135m")
enable_adaflash(target)
chat = pipeline("text-generation", model=target, tokenizer=tokenizer, assistant_model=drafter)
question = sys.argv[1] if len(sys.argv) > 1 else "Explain what a hash map is."
chat([{"role": "user", "content": question}], max_new_tokens=128, do_sample=False,
     streamer=TextStreamer(tokenizer, skip_prompt=True, skip_special_tokens=True))
print(f"\ntau {last_generation_stats(target).mean_accepted_length:.2f}")
