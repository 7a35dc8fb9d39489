"""The terminal-agent task: one persistent bash per rollout in a bubblewrap sandbox (sandbox.py, supervisor.py,
pool.py), turns of ``<bash>cmd</bash>`` / ``<submit/>`` (actions.py, episode.py), a verifier ``tests/test.sh``
scored 0/1; tasks generated offline (offline.py) or loaded from the published rows (rows.py); SFT demonstrations
from scripted solutions (demos.py); the Task itself (task.py)."""
