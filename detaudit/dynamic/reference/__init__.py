"""Reference runs: ``detaudit run --save-reference DIR`` keeps one traced run
in a folder, ``--against DIR`` compares a later run, on another machine,
torch or setting, with it.

``folder.py`` writes and reads the folder (its manifest, the compressed
trace, the first steps' tensors and the final state); ``explain.py`` says
which environment differences explain a drift; ``precision.py`` finds, by
value, the ops that round differently when the reference computed in
another precision; ``eager.py`` finds the first compiled graph that
departs from eager when the reference ran eagerly.  The runs themselves are
``runner.py``'s (and ``audit.py``'s in-process): the reference is run 1 of
an audit whose trace was recorded elsewhere, and ``verdict/`` gives the
verdict (identical, within-tolerance, drift).  May import ``compare`` and
``verdict``; imports neither torch nor numpy but to measure tensors
(``precision.py``).
"""
