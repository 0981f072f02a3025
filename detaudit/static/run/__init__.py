"""A whole ``detaudit check`` run over the paths it is given.

``checker.py`` checks every file ``discovery.py`` finds, from the result cache
(``cache.py``) where a file is unchanged, else one by one or in worker
processes, and filters the findings by the ``[tool.detaudit]`` configuration
(``config.py``).  This is the top of the static pass: it imports
``engine/check.py``, ``engine/limits.py`` (the default time budget),
``context.py``, ``fixes/code.py`` (the fix styles a config may name) and, to
resolve rule names, ``rule.py``; of the modules below it only
``fixes/apply.py`` imports it, for the configuration of the run it fixes.
"""
