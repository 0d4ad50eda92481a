"""Offline drafter training: losses, anchor/block layout, training data and the trainer (loaded on first use)."""

__all__ = ["TrainDrafterConfig", "train_drafter"]


def __getattr__(name):
    if name == "TrainDrafterConfig":  # torch-free, like every command's config
        from .configs import TrainDrafterConfig

        return TrainDrafterConfig
    if name in __all__:
        from . import trainer

        return getattr(trainer, name)
    raise AttributeError(f"module 'adaflash_hf.training' has no attribute {name!r}")
