"""Checking one file, and the building blocks the rest of the static pass reads.

``check.py`` is the pipeline: pre-filter, read, parse, the shared walk, the
rules, where each finding is (``locate.py``) and whether a comment suppresses
it (``suppressions.py``).  The building blocks are ``sources.py`` and
``notebooks.py`` (bytes to text), ``limits.py`` (what keeps the check of a file
bounded), ``trees.py`` (parsing without the cyclic GC), ``walk.py`` (the
read-only walk), ``names.py`` (the import table) and ``facts.py`` (what the walk
collects).  The building blocks import only each other, ``detaudit.findings``
and ``detaudit.knowledge``, so that analyses and rules can read them; the
pipeline also imports ``context.py``, the rule registry (``rule.py``, and
``rules/parse_error.py`` for the files it cannot check) and ``fixes/code.py``
(the default fix style), never ``analyses/``, ``fixes/apply.py`` or ``run/``.
"""
