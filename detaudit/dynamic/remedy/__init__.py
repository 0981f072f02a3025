"""``detaudit run --remedy``: the cheapest change that makes a script reproducible.

``catalogue.py`` (the remedies, as child settings the bootstrap applies and
as code to paste; which fit a cause) and ``search.py`` (trying them, alone and
in the smallest covering combinations, each confirmed by a rerun, then timing
the step under each).  Imports neither torch nor numpy: every trial is a
child process.
"""
