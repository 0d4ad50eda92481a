"""The default verify-length policy of the commands that serve a drafter (``adaflash serve``, the demo).

It picks the length head bundled beside the drafter when there is one; the policies themselves live in
``adaflash_hf.decoding.policy``, the heads in ``adaflash_hf.training.length_head``.
"""

import logging

logger = logging.getLogger(__name__)


def adaptive_policy(
    drafter, length_head: str = "auto", target_name: str | None = None, max_row_slowdown: float | None = None
):
    """The default verify-length policy: goodput with the length head's acceptance estimates when one is
    available ('auto': bundled beside the drafter), plain goodput otherwise (None: the engine's default).
    ``max_row_slowdown``: the opt-in row slowdown bound (:class:`~adaflash_hf.decoding.policy.GoodputVerifyLength`)."""
    if drafter is None or length_head == "none":
        return _bounded(None, max_row_slowdown)
    from .decoding.policy import LengthHeadVerifyLength
    from .training.length_head import load_length_head

    try:
        head = load_length_head(length_head, drafter, target_name=target_name)
    except ValueError:
        if length_head != "auto":
            raise
        logger.info("no bundled length head for %s: verify lengths from the acceptance estimator alone", target_name)
        return _bounded(None, max_row_slowdown)
    return _bounded(LengthHeadVerifyLength(head), max_row_slowdown)


def _bounded(policy, max_row_slowdown: float | None):
    """``policy`` (None: the engine's default goodput policy) with the row slowdown bound set, where one is given."""
    if max_row_slowdown is None:
        return policy
    if not max_row_slowdown >= 1.0:
        raise ValueError(
            f"max_row_slowdown={max_row_slowdown}: a request can be at most this many times slower than under plain "
            "decoding; give a factor >= 1 such as 1.05, or leave it unset for no bound."
        )
    from .decoding.policy import GoodputVerifyLength

    policy = policy if policy is not None else GoodputVerifyLength()
    policy.max_row_slowdown = max_row_slowdown
    return policy
