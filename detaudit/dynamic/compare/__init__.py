"""Comparing what two runs recorded, without torch.

``trace_format.py`` (the trace a traced run writes: ``OpRecord``,
``RngEvent``, ``Trace``), ``causes.py`` (the registry of cause kinds),
``classify.py`` (aligning two traces and naming the cause of each
difference), ``divergence.py`` (how far a difference spread, step by step)
and ``state_diff.py`` (comparing two final states by their digests).
Imports neither torch nor numpy (tested: ``tests/test_dynamic_layers.py``);
torch is imported inside a function only to measure tensors whose digests
differ.
"""
