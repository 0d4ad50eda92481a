"""Serving: a continuous-batching scheduler (``scheduler``) and an OpenAI-compatible HTTP server over it
(``server``, with its wire format in ``protocol``). Nothing is imported here, so the CLI can read
``ServeArgs`` without loading torch or the web stack.
"""
