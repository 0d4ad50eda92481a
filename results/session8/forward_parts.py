import torch, time
from adaflash_hf import load_target
from transformers import DynamicCache
torch.set_num_threads(2)
for dt in ("bf16", "fp32"):
    model, tok = load_target("smollm2-135m", dtype=dt)
    ids = torch.randint(100, 20000, (1, 256))
    def med(f, n=10):
        ts = []
        for _ in range(n):
            t = time.perf_counter(); f(); ts.append(time.perf_counter() - t)
        ts.sort(); return ts[n // 2] * 1e3
    with torch.inference_mode():
        c = DynamicCache(); model(input_ids=ids, cache=c, use_cache=True)
        for k in (1, 16):
            x = torch.randint(100, 20000, (1, k)); pos = torch.arange(256, 256 + k)[None]
            def body():
                model.model(input_ids=x, position_ids=pos, cache=c, use_cache=True); c.crop(-k)
            h = torch.randn(1, k, 576, dtype=model.dtype)
            head = lambda: model.lm_head(h)
            print(dt, k, "body", round(med(body), 1), "lm_head", round(med(head), 1))
