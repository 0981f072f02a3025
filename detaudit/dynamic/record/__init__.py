"""The child side of the dynamic pass: what a traced run records while the
script trains.

``tracer.py`` (the ``TorchDispatchMode`` that records every aten op with
digests of what it reads and writes), ``digests.py`` (how a tensor's bytes
become a digest), ``storage_tables.py`` (which digest each storage's bytes
have now), ``collectives.py`` (torch.distributed's ops), ``hooks.py`` (module
and optimizer hooks: which module runs, where a step ends, the step limit),
``online_capture.py`` (a later run comparing itself with run 1 as it goes),
``final_state.py`` (the state a run ends with), and ``native/`` (the compiled
twin of the tracer's hot path).  Everything here imports torch and runs in
the audited process; nothing here decides what a difference means
(``detaudit.dynamic.compare`` does, without torch).
"""
