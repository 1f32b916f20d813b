"""The demonstrations of `gpupool demo`: the live service on this machine (`live.py`), the
scheduling core in the simulator (`simulated.py`, `--simulated`), and one pool over a Ray
cluster it starts on loopback (`cluster.py` with `loopback.py`, `--cluster`)."""
