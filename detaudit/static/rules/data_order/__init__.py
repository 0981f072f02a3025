"""Data order (DET030-039): DataLoader workers and shuffles, directory listings and sets of strings whose order becomes data, samplers that differ between ranks.

One module per rule, named after it; what the two order rules share (following
an unordered value through a scope) is in ``_common.py``, the only module of
``rules/`` they import.
"""
