"""Batch invariance: does a sample's result depend on the batch it is in?

``audit.py`` (``audit_batch_invariance``: batches of real samples per size
and position, its own small dispatch mode digesting per-sample slices, the
first op that differs; imports torch), ``report.py`` (its torch-free report),
``vary.py`` (``detaudit run --vary batch``: the script's
``detaudit_batch_entry`` audited in a child, the report read back).
"""
