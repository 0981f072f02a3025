"""From the comparisons of R runs to a report and its verdict, without torch.

``build.py`` (the R repeats' traces and states into one ``RunReport``),
``run_report.py`` (the report, its verdict rules and its findings, text,
JSON and JUnit; against a reference, its identical / within-tolerance /
drift verdict), ``tolerance.py`` (``--tolerance``), ``ranks.py`` (merging the per-rank reports of a distributed
run and checking the replicas across ranks).  May import
``detaudit.dynamic.compare``; imports neither torch nor numpy (tested), but
to measure the tensors of a cause the parent hands it.
"""
