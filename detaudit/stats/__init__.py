"""Reproducibility statistics: judging a result over several seeds.

``variance.py`` (``detaudit variance``: K runs with fixed and with varied
seeds, the spread each leaves), ``compare.py`` (``detaudit compare``: two
models' per-seed results, paired tests, bootstrap intervals, seeds needed),
``instability.py`` (``detaudit instability``: Summers & Dinneen's one-ULP
probe, with ``perturbation.py``, its launch feature), and beneath them
``runner.py`` (parallel runs through ``detaudit.launch``), ``study.py``
(resumable, shardable study folders), ``metrics.py`` (what user scripts log),
``numerics.py``, ``robust.py``, ``power.py`` (the statistics themselves),
``display.py`` and ``plot.py``.  May import ``detaudit.launch`` and, for the
final state a run saves, ``detaudit.dynamic.record``; scipy and numpy only
inside the functions that need them.
"""
