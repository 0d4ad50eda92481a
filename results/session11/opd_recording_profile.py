"""Session 11 probe: cProfile of one recording pass of results/session11/opd_overhead.py (8 fiction prompts, 64 tokens):
how much of serving time the OPD observer (trajectory recording) takes.

python results/session11/opd_recording_profile.py
"""
import cProfile, pstats, sys
sys.argv = ["x"]
src = open("results/session11/opd_overhead.py").read().split("serve()\nresults")[0]
exec(compile(src, "p", "exec"))
serve()
opd = AdaFlashOPD(target, drafter, OPDConfig(buffer_trajectories=1000))
import time
t = time.perf_counter(); r0 = serve(); print("LoRA", r0)
pr = cProfile.Profile(); pr.enable(); r1 = serve(opd.observer); pr.disable(); print("rec", r1)
st = pstats.Stats(pr); st.sort_stats("cumtime")
st.print_stats("trajectories|opd.py|adapters", 12)
