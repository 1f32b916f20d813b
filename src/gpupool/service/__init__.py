"""The live service: the control loop and what it keeps and answers to.

- `loop`: the control loop (store → snapshot → decide → store → executor), on the wall clock.
- `snapshots`: what the loop decides on, the store read whole once, then what changed.
- `launches`: what an attempt starts with; `workspace`: where jobs' folders, logs and
  scripts are, and how tokens are kept.
- `interface`: the narrow `Service` the API talks to, instead of the loop.
- `observer`: what the loop tells those who watch it (the telemetry, the queue's line).
- `leader`: one scheduler per data directory and per store.

Nothing is imported here: the API loads `interface` and `workspace` without the loop.
`gpupool.up` puts the service, the executor and the API together.
"""
