"""Write a datastore = the bundled one + the cached responses of other prompt sets (session 17).

python results/session17/extend_datastore.py OUT.safetensors DATA_DIR/train/<prompt-set folder> [...]
"""
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file

from adaflash_hf.decoding.proposers import save_datastore
from adaflash_hf.training.data import _read_shard

BUNDLED = Path(__file__).resolve().parents[2] / "adaflash_hf/bundled/smollm2-135m/datastore.safetensors"
tensors = load_file(str(BUNDLED))
streams = [s.tolist() for s in torch.split(tensors["tokens"].long(), tensors["lengths"].tolist())]
added = 0
for folder in sys.argv[2:]:
    for shard in sorted(Path(folder).glob("shard_*.safetensors")):
        for seq in _read_shard(shard):
            streams.append(seq.input_ids[seq.start:].tolist())
            added += len(streams[-1])
save_datastore(streams, sys.argv[1])
print(f"{sum(map(len, streams))} tokens ({added} added) -> {sys.argv[1]}")
