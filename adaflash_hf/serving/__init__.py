"""Serving: a continuous-batching scheduler (``scheduler``, its request types in ``requests``) and an
OpenAI-compatible HTTP app over it (``app``: routes; ``protocol``: the wire format; ``generation``: text
and errors; ``auth``: API keys; ``metrics``: Prometheus), run by ``server`` with a graceful drain.
The ``adaflash serve`` command that wires them to a target, drafter and OPD trainer is
:mod:`adaflash_hf.serve`. Nothing is imported here, so the CLI stays light.
"""
