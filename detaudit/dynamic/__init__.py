"""The dynamic pass: run a training step several times under identical seeds
and name what differs.

``runner.py`` is ``detaudit run``'s engine (R traced runs of the script,
compared and reported), ``audit.py`` the in-process ``detaudit.audit()``,
``variations.py`` the table of what ``--vary`` changes between repeats, and
``repro.py`` the standalone repro of a root cause (``--repro``).
Below them, by concern: ``record/`` (the child side: the tracer and what it
records; imports torch), ``compare/`` and ``verdict/`` (what the records
mean; torch-free), ``batch/`` (batch invariance), ``remedy/`` (``--remedy``), ``reference/`` (``--save-reference`` / ``--against``)
and ``faults/`` (test-only fault injection).  Child processes are started
through ``detaudit.launch``.
"""
