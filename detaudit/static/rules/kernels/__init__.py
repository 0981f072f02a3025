"""Kernels, memory and collectives (DET020-029): nondeterministic ops, uninitialised memory, bitwise comparisons across batch sizes, unfinished collectives.

One module per rule, named after it.  They share nothing but what the
analyses offer (``analyses/op_sites.py``, ``analyses/execution.py``,
``analyses/distributed.py``), so a module here imports no other module of
``rules/``.  Which ops are nondeterministic, with which arguments and on which
devices, and which ops vary with the batch size is data in
``detaudit.knowledge``.
"""
