"""Running a user's script in a child process under detaudit's control.

``process.py`` starts ``python -m detaudit.launch.bootstrap`` in a fresh
process group, keeps the tail of its output and leaves no process of it
behind (timeout, Ctrl-C, children that outlive it); ``torchrun.py`` does the
same for one run through ``torch.distributed.run`` with a bootstrap per rank;
``bootstrap.py`` is the child: it seeds, applies what the launch options ask
for, counts optimizer steps (and stops at the step limit), runs the script as
``python SCRIPT ARGS`` would, and writes its results.  Shared by ``detaudit
run`` (``detaudit.dynamic``) and the statistics (``detaudit.stats``).  The
parent-side modules import neither torch nor numpy; the child imports torch
when an option needs it.
"""
