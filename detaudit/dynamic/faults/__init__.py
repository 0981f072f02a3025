"""Test-only fault injection: one op call of one repeat gives different bits.

``spec.py`` reads ``DETAUDIT_TEST_FAULT`` (torch-free, the parent reads it
too); ``injector.py`` is the ``TorchDispatchMode`` that perturbs the output in
the child.  Never part of a real audit: the test suite uses it to prove that
every localization path works where CPU nondeterminism cannot reach.
"""
