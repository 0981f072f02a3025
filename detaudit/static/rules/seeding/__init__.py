"""Seeding (DET001-009): RNGs never seeded, seeded only off by default or too late, seeds that differ per run or per rank.

One module per rule, named after it; what several of them share (the base of
the missing-seed rules, the seeding fix, how a draw is named) is in
``_common.py``, the only module of ``rules/`` they import.  The draw-based
rules read the file's seeding analysis (``self.analyses.seeding``,
``analyses/seeding.py``): which RNGs the file seeds (directly, in its own
helpers, in project helpers, through known third-party helpers), where each
RNG is first drawn from when the file runs, and which comes first on the
script's straight-line path.  A file counts as a script only through what
runs when it is executed: module level code (the main guard included) and the
local functions and classes it calls.  A library module (RNG use only inside
functions nobody calls at module level) is never asked for a seed: its caller
seeds.
"""
