"""The shipped general assistant requests (``adaflash_hf/data/instruct_prompts.jsonl``) load as a prompt dataset."""

from adaflash_hf.data import INSTRUCT_PROMPTS_FILE, load_instruct_prompts


def test_the_shipped_instruct_prompts_load_as_a_prompt_set():
    assert INSTRUCT_PROMPTS_FILE.parent.name == "data" and INSTRUCT_PROMPTS_FILE.parent.parent.name == "adaflash_hf"
    prompts = load_instruct_prompts()
    assert len(prompts) == 2000 and set(prompts["domain"]) == {"instruct"}
    assert len(set(prompts["prompt"])) == 2000 and all(p.strip() for p in prompts["prompt"])
