"""The default verify-length policy of the commands that serve a drafter (``adaflash serve``, the demo).

It picks the length head bundled beside the drafter when there is one; the policies themselves live in
``adaflash_hf.decoding.policy``, the heads in ``adaflash_hf.training.length_head``.
"""

import logging

logger = logging.getLogger(__name__)


def adaptive_policy(drafter, length_head: str = "auto", target_name: str | None = None):
    """The default verify-length policy: goodput with the length head's acceptance estimates when one is
    available ('auto': bundled beside the drafter), plain goodput otherwise (None: the engine's default)."""
    if drafter is None or length_head == "none":
        return None
    from .decoding.policy import LengthHeadVerifyLength
    from .training.length_head import load_length_head

    try:
        head = load_length_head(length_head, drafter, target_name=target_name)
    except ValueError:
        if length_head != "auto":
            raise
        logger.info("no bundled length head for %s: verify lengths from the acceptance estimator alone", target_name)
        return None
    return LengthHeadVerifyLength(head)
