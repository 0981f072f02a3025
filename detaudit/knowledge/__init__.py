"""detaudit's knowledge base: facts about torch kept as JSON tables, and the
modules that read them.  ``apis`` (API facts several parts share),
``backend_settings`` (the settings that decide reproducibility), ``ops/`` (the
nondeterministic ops), ``batch_ops`` (the batch-variant ops) and ``layers``
(third-party layers, from ``derived_layers/``) each read their table through
``_json_reader`` (one validating pass that names the JSON path of the first
problem), with ``versions`` (the torch version ranges the tables share);
``calibrate`` with ``calibration_recipes``, and ``derive_layers``, rebuild the
ops and layer tables by running torch.  The readers import only the standard
library and each other, never torch or numpy: the static linter imports them.
Only the three torch-running modules import torch (``calibrate`` also
``detaudit.runtime``), and nothing here imports ``static``, ``dynamic`` or
``cli``."""
