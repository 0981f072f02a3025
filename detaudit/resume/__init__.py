"""``detaudit resume``: does a training resumed from its checkpoint continue
exactly as one that was never interrupted, and if not, what did the
checkpoint forget?

Three runs of one script under one seed: straight for N optimizer steps;
interrupted before its (K+1)-th step, as a preemption would stop it, after
whatever it saved at step K; resumed with the resume arguments for N-K steps.
The resumed run's state as its first step starts, and at each of its step
ends, is compared by digest, component by component, with the straight run's
at the same overall step.

* ``components.py``: the components compared, what a difference in each
  means and how to fix it (data: every part reads it from there);
* ``presets.py``: how the resumed run is made to resume, per framework
  (data, torch-free);
* ``feature.py``: the launch feature (torch-free module; the child's work
  is in ``child.py``, which imports torch): digests of every component at
  each step boundary, the checkpoint's save and load lines and the paths it
  went to, the stop before step K+1; ``frameworks.py`` (the frameworks'
  checkpoint saves, a preset's resume call) and ``first_reader.py`` (the
  first op that reads what differs) are the child's too;
* ``compare.py``: the runs' digests into differences (torch-free);
* ``report.py``: the verdict, its text and JSON (torch-free);
* ``audit.py``: the three runs through ``detaudit.launch`` and the report
  (imports torch only to measure a difference).

May import ``detaudit.launch``, ``detaudit.report``, ``detaudit.findings``
and, in the child, ``detaudit.dynamic.record`` (its digests and state
walkers); nothing of it is imported by ``detaudit check``.
"""
