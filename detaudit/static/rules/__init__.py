"""The rule catalogue.  Importing this package registers every rule.

Code ranges: DET000 parse errors · DET001-009 seeding · DET010-019 backend and
determinism settings · DET020-029 nondeterministic ops and memory ·
DET030-039 data order and loading · DET040-049 TensorFlow/Keras and JAX.
"""

from detaudit.static.rules import backends, parse_error  # noqa: F401
from detaudit.static.rules import determinism  # noqa: F401
from detaudit.static.rules import seeds  # noqa: F401
from detaudit.static.rules import data_loading, entropy, memory, ordering  # noqa: F401  (catalogue part B)
from detaudit.static.rules import backend_flags  # noqa: F401
from detaudit.static.rules import ops  # noqa: F401
from detaudit.static.rules import tensorflow_jax  # noqa: F401
