"""Start a fresh drafter near the target: draft layers as copies of the target's own upper layers.

A drafter layer has the shape of a target layer (hidden size, heads, MLP), so it can start as a copy of
the target layers just above the deepest context layer ``d``. The context projection ``fc`` then starts
as a pass-through of layer ``d``'s hidden states and ``hidden_norm`` as the first copied layer's input
norm, so the first draft layer's keys and values over the context are the ones that target layer
computes. The target (Llama, Qwen2) has no q/k norm, while the drafter keeps the DFlash layout's
Qwen3-style q/k RMSNorm; its weights start at the mean RMS of the copied layer's queries and keys on a
calibration batch, so normalising changes their scale as little as possible.
"""

from __future__ import annotations

import torch
from transformers import PreTrainedModel

from ..modeling_adaflash import AdaFlashDrafter

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
