"""Changing checked files: ``detaudit check --fix`` and ``--diff``, and ``--add-ignores``.

``edits.py`` holds the edit primitives a rule attaches to a finding and
``code.py`` the code a fix writes in each fix style: rules build their fixes
from these two, so they import nothing of the static pass (``code.py`` reads
``detaudit.knowledge``).  ``apply.py`` applies the edits of a file's findings,
re-checking the file with ``engine/check.py`` until nothing fixable is left,
and reads which findings the run selected from ``run/config.py`` and
``run/discovery.py``; ``baseline.py`` writes a suppression comment for every
current finding.
"""
