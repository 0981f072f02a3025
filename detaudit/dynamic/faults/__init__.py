"""Test-only fault injection: one op call of one repeat gives different bits.

``spec.py`` reads ``DETAUDIT_TEST_FAULT`` (torch-free, the parent reads it
too), ``feature.py`` is the launch feature that carries it to the child, and
``injector.py`` is the ``TorchDispatchMode`` that perturbs the output there.  Never part of a real audit: the test suite uses it to prove that
every localization path works where CPU nondeterminism cannot reach.
"""
