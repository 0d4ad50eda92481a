"""fp32 linear kernels at decoding's shapes: stock F.linear (MKL sgemm) against oneDNN's packed weight.

python results/session14/fp32_linear.py   (session 14 probe; SmolLM2-135M's three linear shapes, 2 threads)
Prints, per (out, in) weight and tokens k, the median ms of: stock F.linear, oneDNN packed.
"""
import torch
import torch.nn.functional as F

from adaflash_hf.kernels import median_ms

torch.set_num_threads(2)

print(next(line.strip() for line in torch.__config__.show().splitlines() if "CPU capability" in line))
for out_features, in_features in [(1536, 576), (576, 1536), (49152, 576)]:
    weight = torch.randn(out_features, in_features)
    packed = torch.ops.mkldnn._reorder_linear_weight(weight, 16)
    row = {}
    for k in (1, 2, 4, 8, 16):
        x = torch.randn(1, k, in_features)
        stock = median_ms(lambda x=x, weight=weight: F.linear(x, weight), repeats=21)
        fast = median_ms(lambda x=x, packed=packed: torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], ""), repeats=21)
        row[k] = (round(stock, 3), round(fast, 3))
    print((out_features, in_features), "stock vs packed ms by tokens:", row)
