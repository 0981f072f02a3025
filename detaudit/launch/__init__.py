"""Running a user's script in a child process under detaudit's control.

The parent's side: ``options.py`` (``LaunchOptions``: the seed, the step
limit, the child settings and the features a run asks for),
``process.py`` (``run_script``: ``python -m detaudit.launch.bootstrap`` in a
fresh process group, the tail of its output kept, no process of it left
behind on timeout, Ctrl-C or children that outlive it) and ``torchrun.py``
(the same for one run through ``torch.distributed.run``, a bootstrap per
rank).  The child's side: ``bootstrap.py`` (seeds, makes the child settings,
watches the training, walks the features, runs the script as ``python SCRIPT
ARGS`` would, writes the payload), ``watcher.py`` (module and optimizer
hooks: which module runs, where a step ends, the step limit).  The two
tables: ``child_settings.py`` (what can be set before the script, and how it
is pasted as code; ``seed_generators.py`` is one of them) and
``features.py`` (what the bootstrap does around the script; the features
themselves live with the packages that own them, named there by path).
Shared by ``detaudit run`` (``detaudit.dynamic``) and the statistics
(``detaudit.stats``), and imports neither: the parent-side modules import
neither torch nor numpy (tested), the child imports torch when a setting or
feature needs it.
"""
