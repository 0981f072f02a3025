"""The knowledge base of nondeterministic PyTorch ops: ``model`` (the typed
entries), ``loading`` (which table, JSON to model in one validating pass) and
``matching`` (the indexed table and its queries), re-exported here.  These
modules import only the standard library and, from detaudit,
``knowledge._json_reader``, ``knowledge.versions`` and
``knowledge.backend_settings`` (an entry names settings of that table); never
torch or numpy, since the static linter imports this package.

The facts live in ``detaudit/knowledge/nondeterministic_ops.json`` (format:
``nondeterministic_ops.schema.json`` next to it), or in a table written by
``detaudit calibrate``.  Three users:

* the static rule ``nondeterministic-op`` asks :meth:`OpsTable.match_call`
  whether a call site reaches a listed op, with the literal arguments it saw;
* the dynamic pass asks :meth:`OpsTable.lookup_aten` (or ``lookup_alert``) for
  the entry behind a root-cause aten op, and prints :meth:`OpEntry.hint`;
* ``detaudit ops`` / ``detaudit calibrate`` print and rebuild the table.

Which table is read: an explicit path, else ``$DETAUDIT_OPS_TABLE``, else the
shipped one.
"""

from detaudit.knowledge.ops.loading import (
    SCHEMA_FILE,
    SCHEMA_VERSION,
    SHIPPED_TABLE,
    TABLE_ENV_VAR,
    OpsTableError,
    load_ops_table,
    parse_ops_table,
)
from detaudit.knowledge.ops.matching import UNKNOWN, CallArguments, OpMatch, OpsTable, alert_caller
from detaudit.knowledge.ops.model import (
    DETERMINISTIC_MODES,
    DEVICES,
    PHASES,
    Behaviour,
    Condition,
    OpEntry,
    Param,
    Spelling,
)

__all__ = [
    "DETERMINISTIC_MODES",
    "DEVICES",
    "PHASES",
    "SCHEMA_FILE",
    "SCHEMA_VERSION",
    "SHIPPED_TABLE",
    "TABLE_ENV_VAR",
    "UNKNOWN",
    "Behaviour",
    "CallArguments",
    "Condition",
    "OpEntry",
    "OpMatch",
    "OpsTable",
    "OpsTableError",
    "Param",
    "Spelling",
    "alert_caller",
    "load_ops_table",
    "parse_ops_table",
]
