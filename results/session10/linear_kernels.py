"""Session 10 probe: the linear layers of a SmolLM2-shaped forward (30 layers + lm_head, distinct cold weights),
F.linear against oneDNN-packed weights, bf16 and fp32, by tokens per call.

python results/session10/linear_kernels.py   (idle machine, 2 threads)
"""
import torch, time
torch.set_num_threads(2)
L=30
shapes=[(576,576),(192,576),(192,576),(576,576),(1536,576),(1536,576),(576,1536)]
def bench(fn, reps=10):
    for _ in range(2): fn()
    ts=[]
    for _ in range(reps):
        t=time.perf_counter(); fn(); ts.append(time.perf_counter()-t)
    ts.sort(); return ts[len(ts)//2]*1e3
for dt in (torch.bfloat16, torch.float32):
    ws=[[torch.randn(o,i,dtype=dt)*0.02 for o,i in shapes] for _ in range(L)]
    lm=torch.randn(49152,576,dtype=dt)*0.02
    packed=None
    try:
        packed=[[torch.ops.mkldnn._reorder_linear_weight(w, 16) for w in lw] for lw in ws]
        lmp=torch.ops.mkldnn._reorder_linear_weight(lm, 16)
    except Exception as e: print("no pack", e)
    for M in (1,4,8,16,32):
        xs={i: torch.randn(1,M,i,dtype=dt) for o,i in shapes}
        def plain():
            for lw in ws:
                for w in lw: torch.nn.functional.linear(xs[w.shape[1]], w)
            torch.nn.functional.linear(xs[576], lm)
        def pk():
            for lw in packed:
                for w in lw: torch.ops.mkldnn._linear_pointwise(xs[w.shape[1]], w, None, "none", [], "")
            torch.ops.mkldnn._linear_pointwise(xs[576], lmp, None, "none", [], "")
        a=bench(plain); b=bench(pk) if packed else float('nan')
        print(dt, M, f"F.linear {a:.1f} ms  packed {b:.1f} ms")
