"""The static pass, ``detaudit check``: read training code (never run it) and report what makes its results irreproducible.

From the bottom up: ``engine/``'s building blocks read, parse and walk a file
and collect its facts; ``fixes/edits.py`` and ``fixes/code.py`` are what fixes
are made of; ``context.py`` holds the types every layer shares and ``rule.py``
the rule base and registry; ``analyses/`` answers what several rules need to
know about a file; ``rules/`` holds one module per rule; ``engine/check.py``
checks one file; ``fixes/apply.py`` and ``run/`` serve a whole run.  A module
imports at its top only from the layers below it; the two reaches up are
function-local and deliberate: the registry loads the rules when first asked,
and a ``FileContext`` builds its analyses on first use.  Nothing here imports
torch or numpy, and libcst only once a file needs a parse.
"""
