"""Backend and determinism settings (DET010-019): switches that trade reproducibility for speed, and requests for deterministic algorithms that are missing, off, only warn or are incomplete.

One module per rule, named after it; what several of them share (the fix that
writes a setting's safe value, how a call is named in messages) is in
``_common.py``, the only module of ``rules/`` they import.  The determinism
rules read the file's determinism state (``self.analyses.determinism``,
``analyses/determinism.py``), the one place that decides "does this file
enable deterministic algorithms?".  Which settings exist, their spellings on
every torch version and their risky and safe values come from the settings
table (``knowledge/backend_settings.json``).
"""
