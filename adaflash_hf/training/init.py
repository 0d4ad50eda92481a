"""How a training run's drafter starts (:func:`build_drafter`), and a fresh drafter near the target: draft layers as
copies of the target's own upper layers.

A drafter layer has the shape of a target layer (hidden size, heads, MLP), so it can start as a copy of
the target layers just above the deepest context layer ``d``. The context projection ``fc`` then starts
as a pass-through of layer ``d``'s hidden states and ``hidden_norm`` as the first copied layer's input
norm, so the first draft layer's keys and values over the context are the ones that target layer
computes. The target (Llama, Qwen2) has no q/k norm, while the drafter keeps the DFlash layout's
Qwen3-style q/k RMSNorm; its weights start at the mean RMS of the copied layer's queries and keys on a
calibration batch, so normalising changes their scale as little as possible.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import torch
from transformers import PreTrainedModel

from ..configuration_adaflash import default_target_layer_ids
from ..modeling_adaflash import AdaFlashDecoderLayer, AdaFlashDrafter
from .configs import CONTEXT_LAYERS, TrainDrafterConfig
from .data import TrainingSequence, collate

if TYPE_CHECKING:
    from .features import FeatureStore

logger = logging.getLogger(__name__)

_COPIED = (
    "self_attn.q_proj",
    "self_attn.k_proj",
    "self_attn.v_proj",
    "self_attn.o_proj",
    "mlp.gate_proj",
    "mlp.up_proj",
    "mlp.down_proj",
    "input_layernorm",
    "post_attention_layernorm",
)


def copied_layer_ids(num_target_layers: int, target_layer_ids: list[int], num_draft_layers: int) -> list[int]:
    """The target layers the draft layers copy: those right above the deepest context layer, or the top ones."""
    if num_draft_layers > num_target_layers:
        raise ValueError(f"{num_draft_layers} draft layers cannot copy a target of {num_target_layers} layers.")
    first = min(max(target_layer_ids) + 1, num_target_layers - num_draft_layers)
    return list(range(first, first + num_draft_layers))


@torch.no_grad()
def _mean_head_rms(projection: torch.nn.Linear, inputs: torch.Tensor, head_dim: int) -> float:
    """Mean over tokens and heads of the RMS of ``projection(inputs)`` per head; inputs (n, H)."""
    out = projection(inputs.to(projection.weight.dtype)).float().view(inputs.shape[0], -1, head_dim)  # (n, heads, hd)
    return float(out.pow(2).mean(-1).sqrt().mean())


@torch.no_grad()
def init_from_target(
    drafter: AdaFlashDrafter, target: PreTrainedModel, input_ids: torch.Tensor, attention_mask: torch.Tensor
) -> list[int]:
    """Copy the target's layers into ``drafter`` (in place) and return the target layer ids copied.

    input_ids/attention_mask (b, L): a calibration batch of real text for the q/k norm scales.
    """
    config = drafter.config
    target_layers = target.get_decoder().layers
    text = target.config.get_text_config()
    if config.intermediate_size != text.intermediate_size or config.hidden_size != text.hidden_size:
        raise ValueError(
            f"init_layers='target' copies target layers, but the drafter's MLP width {config.intermediate_size} "
            f"differs from the target's {text.intermediate_size}: drop --intermediate-size or use "
            "--init-layers random."
        )
    copied = copied_layer_ids(len(target_layers), config.target_layer_ids, config.num_hidden_layers)

    # Inputs of each copied layer's attention, from one target forward (hidden_states[j] feeds layer j).
    out = target(
        input_ids=input_ids.to(target.device),
        attention_mask=attention_mask.to(target.device),
        output_hidden_states=True,
        use_cache=False,
    )
    keep = attention_mask.bool().to(target.device)
    for draft_layer, j in zip(drafter.layers, copied):
        source = target_layers[j]
        source_params = dict(source.named_parameters())
        for name, param in draft_layer.named_parameters():
            prefix = name.rsplit(".", 1)[0]
            if prefix in _COPIED:
                param.copy_(source_params[name].to(param.dtype))
        if config.qk_norm:
            normed = source.input_layernorm(out.hidden_states[j])[keep]  # (n, H)
            attention = draft_layer.self_attn
            attention.q_norm.weight.fill_(_mean_head_rms(source.self_attn.q_proj, normed, config.head_dim))
            attention.k_norm.weight.fill_(_mean_head_rms(source.self_attn.k_proj, normed, config.head_dim))

    # The context projection passes the deepest context layer through, normalised as the first copy normalises.
    hidden = config.hidden_size
    deepest = config.target_layer_ids.index(max(config.target_layer_ids))
    drafter.fc.weight.zero_()
    drafter.fc.weight[:, deepest * hidden : (deepest + 1) * hidden] = torch.eye(hidden, dtype=drafter.fc.weight.dtype)
    drafter.hidden_norm.weight.copy_(
        target_layers[copied[0]].input_layernorm.weight.to(drafter.hidden_norm.weight.dtype)
    )
    return copied


@torch.no_grad()
def grow_drafter(drafter: AdaFlashDrafter, add_layers: int) -> None:
    """Append ``add_layers`` fresh decoder layers to ``drafter`` (in place), each starting as the identity.

    A new layer's attention and MLP outputs are zero at the start (their output projections are zeroed, the
    rest initialised as usual), so each adds nothing to the residual stream: the grown drafter proposes exactly
    what the trained one did, and training moves on from its accuracy instead of from scratch. The output
    projections receive gradients at once (their inputs are not zero), the layers' other weights from the
    next step on.
    """

    reference = drafter.fc.weight
    first = drafter.config.num_hidden_layers
    drafter.config.num_hidden_layers = first + add_layers
    for index in range(first, first + add_layers):
        layer = AdaFlashDecoderLayer(drafter.config, index)
        layer.apply(drafter._init_weights)
        for projection in (layer.self_attn.o_proj, layer.mlp.down_proj):
            projection.weight.zero_()
            if projection.bias is not None:
                projection.bias.zero_()
        drafter.layers.append(layer.to(device=reference.device, dtype=reference.dtype))


def build_drafter(
    config: TrainDrafterConfig,
    target: PreTrainedModel,
    mask_token_id: int,
    store: FeatureStore | None,
    sequences: list[TrainingSequence],
    pad_id: int,
) -> AdaFlashDrafter:
    """The fp32 drafter a training run starts from.

    ``config.init_from``'s architecture and weights, or a fresh drafter (random layers, or copies of the target's
    with ``init_layers='target'``) reading the feature cache's layers when ``store`` is given and none are asked
    for. ``sequences`` (the training responses, else the held-out ones) calibrate copied layers and, with
    ``draft_vocab_size``, choose the draft vocabulary.
    """
    overrides = {"mask_token_id": mask_token_id}
    if config.target_layer_ids is not None:
        overrides["target_layer_ids"] = list(config.target_layer_ids)
    else:  # one middle layer (DFlash's default for a 1-layer drafter) learns markedly slower: docs/research-log.md
        num_target_layers = target.config.get_text_config().num_hidden_layers
        overrides["target_layer_ids"] = default_target_layer_ids(
            num_target_layers, max(config.num_layers, CONTEXT_LAYERS)
        )
    if config.intermediate_size is not None:
        overrides["intermediate_size"] = config.intermediate_size
    if store is not None and config.target_layer_ids is None and config.init_from is None:
        overrides["target_layer_ids"] = store.layer_ids  # the cache's layers unless asked otherwise
    if config.init_from is not None:  # continue from a trained drafter: its architecture, its weights
        from ..drafters import load_drafter

        drafter = (
            load_drafter(config.init_from, target, target_name=config.target, datastore=False)
            .float()
            .requires_grad_(True)
        )
        if drafter.config.block_size != config.block_size:
            raise ValueError(
                f"--init-from {config.init_from} has block size {drafter.config.block_size}, but the run uses "
                f"--block-size {config.block_size}: pass --block-size {drafter.config.block_size}."
            )
        if config.add_layers:
            grow_drafter(drafter, config.add_layers)
            drafter.requires_grad_(True)
        logger.info(
            "initialised from %s: %d layers, block %d, context layers %s",
            config.init_from,
            drafter.config.num_hidden_layers,
            drafter.config.block_size,
            drafter.config.target_layer_ids,
        )
    else:
        drafter = AdaFlashDrafter.from_target(target, config.num_layers, config.block_size, **overrides).float()
        # The drafter's output goes through the target's lm_head: start at the scale of the target's final norm.
        with torch.no_grad():
            drafter.norm.weight.copy_(target.get_decoder().norm.weight.float())
        if config.init_layers == "target":
            calibration = collate(sequences[:4], pad_id)
            copied = init_from_target(drafter, target, calibration.input_ids, calibration.attention_mask)
            logger.info("draft layers start as copies of target layers %s", copied)
    if store is not None:
        store.check(config.target, drafter.config.target_layer_ids)
    if config.draft_vocab_size is not None:
        from .vocab import most_frequent, response_token_counts

        eos = torch.tensor(target.generation_config.eos_token_id).flatten().tolist()
        drafter.set_draft_vocab(
            most_frequent(
                response_token_counts(sequences), config.draft_vocab_size, drafter.config.vocab_size, always=eos
            )
        )
    return drafter
