"""Checkpoints (DET050-059): resumes that leave out training state the script uses.

One module per rule, named after it.  They read the file's checkpoints
analysis (``self.analyses.checkpoints``, ``analyses/checkpoints.py``): the
dicts holding optimizer state that the file saves, the LR schedulers and
GradScalers it builds, what it keeps drawing while it trains, and the loads
that resume a run with the weights alone; and the
seeding analysis for which RNGs the file means to repeat.  ``detaudit resume``
measures the same hazards by running the script; these rules read them off
the code, in one file.
"""
