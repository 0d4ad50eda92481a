"""Offline drafter training: losses, anchor/block layout, training data and the trainer."""

from adaflash_hf.training.trainer import TrainDrafterConfig, train_drafter

__all__ = ["TrainDrafterConfig", "train_drafter"]
