"""Incremental detokenization: text deltas of a growing token list, safe across split UTF-8 characters.

Shared by the HTTP server (``adaflash_hf.serving``) and the demo, which both stream text as tokens arrive.
Pure Python over a tokenizer's ``decode``: no torch or web imports.
"""


class IncrementalDetokenizer:
    """Text deltas of a growing token list that join to ``decode(all tokens, skip_special_tokens=True)``.

    Each step decodes only a window, from the last emitted token to the end, and emits what it adds
    beyond the window's already-emitted head (the "decode prefix, emit the delta" scheme of TGI and
    vLLM); the head keeps word-boundary spaces right. Text ending in U+FFFD is an incomplete UTF-8
    character (its bytes split across tokens) and waits for the next tokens; `flush` emits whatever
    is left at the end.
    """

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.token_ids: list[int] = []
        self.prefix_offset = 0  # window start
        self.read_offset = 0  # tokens before this are emitted

    def add(self, token_ids: list[int]) -> str:
        self.token_ids.extend(token_ids)
        return self._delta(final=False)

    def flush(self) -> str:
        return self._delta(final=True)

    def _delta(self, final: bool) -> str:
        if self.read_offset == len(self.token_ids):
            return ""
        head = self._decode(self.prefix_offset, self.read_offset)
        text = self._decode(self.prefix_offset, len(self.token_ids))
        if not final and (len(text) <= len(head) or text.endswith("\ufffd")):
            return ""
        self.prefix_offset, self.read_offset = self.read_offset, len(self.token_ids)
        return text[len(head) :]

    def _decode(self, start: int, end: int) -> str:
        return self.tokenizer.decode(self.token_ids[start:end], skip_special_tokens=True)
