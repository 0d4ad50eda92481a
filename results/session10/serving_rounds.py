"""Session 10 probe: what the adaptive server's rounds do under load (no HTTP), with the engine in a background thread
as session 10 served it. Now results/session11/serving_rounds.py with its "background" option (which also prints the
propose and prefill times).

python results/session10/serving_rounds.py 16 adaflash [padded]   (concurrency, method, optional: ragged off)
"""
import runpy
import sys
from pathlib import Path

sys.argv.append("background")
runpy.run_path(str(Path(__file__).parents[1] / "session11" / "serving_rounds.py"), run_name="__main__")
