"""The dynamic pass: run a training step several times under identical seeds
and name what differs.

``runner.py`` is ``detaudit run``'s engine (R traced runs of the script,
compared and reported), ``audit.py`` the in-process ``detaudit.audit()``, and
``variations.py`` the table of what ``--vary`` changes between repeats.
Below them, by concern: ``record/`` (the child side: the tracer and what it
records; imports torch), ``compare/`` and ``verdict/`` (what the records
mean; torch-free), ``batch/`` (batch invariance), ``remedy/`` (``--remedy``)
and ``faults/`` (test-only fault injection).  Child processes are started
through ``detaudit.launch``.
"""
