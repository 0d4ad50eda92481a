"""Session 11 probe: serving_rounds.py with the guard's min_rows set (8: the goodput choice alone decides below 8 rows).

python results/session11/guard_min_rows.py 4 adaflash 8   (concurrency, method, min_rows)
"""
import sys
c, method, min_rows = sys.argv[1], sys.argv[2], int(sys.argv[3])
sys.argv = ["x", c, method]
src = open("/work/main/results/session11/serving_rounds.py").read()
src = src.replace("s.batch.on_round = record\n", f"s.batch.on_round = record\nif hasattr(s.batch.policy, 'min_rows'): s.batch.policy.min_rows = {min_rows}\n")
exec(compile(src, "probe", "exec"))
