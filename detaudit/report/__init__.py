"""The output writers every command shares, each written once from ``Finding``.

``text.py`` (rich, for a terminal), ``jsonout.py``, ``sarif.py`` (SARIF
2.1.0, with the safe fixes findings carry), ``github.py`` (workflow
annotations), ``html.py`` and ``divergence_chart.py`` (the run report's
page and chart), ``progress.py`` (the progress of multi-run work, on
stderr).  May import ``detaudit.findings`` and, for the HTML page, the run
report's types (``detaudit.dynamic.verdict``, ``detaudit.dynamic.compare``);
never torch.
"""
