"""The one place where a user's text becomes the token ids a target continues: the chat template.

The command line, the benchmark, training data and the server all build prompts here, so they
agree token for token. Light on purpose: it imports neither torch nor transformers.
"""

from __future__ import annotations


def chat_prompt_ids(tokenizer, prompt: str | list[dict], raw: bool = False) -> list[int]:
    """Token ids of ``prompt`` as the target should see it, ending where the assistant's answer starts.

    ``prompt`` is one user message (a string) or a whole conversation (``[{"role", "content"}, ...]``).
    The tokenizer's chat template is applied with the assistant header (``add_generation_prompt``).
    With ``raw=True``, or when the tokenizer has no chat template, a string is tokenized as plain text
    (with the tokenizer's usual special tokens) for the target to continue.
    """
    if isinstance(prompt, str):
        messages = [{"role": "user", "content": prompt}]
    else:
        messages = list(prompt)
        if not messages or not all(isinstance(m, dict) and {"role", "content"} <= m.keys() for m in messages):
            raise ValueError("a conversation must be a non-empty list of {'role': ..., 'content': ...} messages.")
    if raw or not tokenizer.chat_template:
        if not isinstance(prompt, str):
            raise ValueError(
                "this tokenizer has no chat template (or raw=True), so the prompt must be plain text, not messages."
            )
        ids = list(tokenizer(prompt)["input_ids"])
        if not ids:
            raise ValueError("the prompt is empty: give at least one token of text to continue.")
        return ids
    encoded = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=True)
    return list(encoded["input_ids"])
