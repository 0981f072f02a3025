"""The child side of the dynamic pass: what a traced run records while the
script trains.

``tracer.py`` (the ``TorchDispatchMode`` that records every aten op with
digests of what it reads and writes), with ``op_info.py`` (what an op's
schema says), ``outside_dispatch.py`` (what it sees outside the dispatcher),
``dynamo.py`` (keeping dynamo out of its handlers), ``compiled_graphs.py``
(a torch.compile'd graph's call as one record), ``graph_bisect.py`` (the first
node inside a graph that departs) and ``native/`` (the compiled twin of its
hot path); ``digests.py`` (how a tensor's bytes become
a digest), ``storage_tables.py`` (which digest each storage's bytes have
now), ``collectives.py`` (torch.distributed's ops), ``online_capture.py`` (a
later run comparing itself with run 1 as it goes), ``final_state.py`` (the
state a run ends with).  ``features.py`` is how a launch asks for them
(``Tracing``, ``ReplicaDigests``, ``SaveFinalState``): it and ``native/``'s
build step import no torch; everything else here imports torch and runs in
the audited process.  May import ``detaudit.launch`` (the watcher) and
``detaudit.dynamic.compare``'s formats and tensor comparison
(``trace_format``, ``state_diff.tensor_diff``) and ``detaudit.knowledge``; nothing here decides what a
difference means (``detaudit.dynamic.compare`` does, without torch).
"""
