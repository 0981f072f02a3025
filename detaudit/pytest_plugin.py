"""The pytest plugin (entry point ``pytest11``, name ``detaudit``): one line
says that a training step must be bitwise reproducible.

    @pytest.mark.deterministic                 # the test body is the step
    def test_one_training_step():
        ...

    def test_one_training_step(deterministic):  # or hand a step to the fixture
        deterministic(train_one_step)

Either way the step runs ``repeats`` times (default 3) in this process, each
time seeded alike and traced op by op (``detaudit.testing.assert_deterministic``);
the test fails with detaudit's report (which op, source line and tensors
differed) when a difference reaches the final state; a latent one (read,
then gone before the final state) only warns, unless ``strict=True``.  With
the marker, fixture values that are torch modules, optimizers or tensors are
put back to their state before each repeat; other fixture objects are shared
by the repeats.

Options: ``--detaudit-repeats N`` (ini ``detaudit_repeats``) and
``--no-detaudit``, which keeps the tests but runs each step once, unchecked
(``-p no:detaudit`` unloads the plugin, and the fixture with it).  Marker
arguments override per test: ``@pytest.mark.deterministic(repeats=5, seed=1,
deterministic=True, strict=True)`` (``deterministic`` runs the repeats
under detaudit's deterministic mode).

A run resumed from its checkpoint is checked the same way
(``detaudit.audit_resume``: straight, interrupted after step K and resumed,
compared component by component):

    @pytest.mark.resume_equivalent("train.py", interrupt_at=4, resume_args="--resume")
    def test_resuming_continues_the_run():
        ...                                     # runs once the resume is found equivalent

    def test_resume(resume_equivalent):         # or call the fixture
        resume_equivalent("train.py", 4, preset="lightning", script_args=["--max-steps", "8"])

The test fails with the report (the components that differ, what each means
and its fix) unless the resume is equivalent.  The script's path is taken
from the rootdir; it runs in the test's ``tmp_path``, unless ``cwd=`` says
where.  Keyword arguments are ``audit_resume``'s.  ``--no-detaudit`` skips
the audit.

A training step can also be held to a committed reference: a numerics
regression test ("this step still gives the bits it gave last release, or
the report says which op moved them"; ``detaudit.testing.assert_matches_reference``):

    @pytest.mark.matches_reference("references/one_step", tolerance=None)
    def test_one_step_keeps_its_numbers():
        ...                                     # the test body is the step

    def test_step(matches_reference):           # or hand a step to the fixture
        matches_reference(train_one_step, "references/one_step")

The folder is taken from the test file's directory.  A missing reference
fails; ``--detaudit-save-references`` writes (or refreshes) every reference
the tests compare with instead of comparing.

pytest imports this module in every environment where detaudit is
installed, so it must not import torch (or numpy): the check imports them
when a test asks for it.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import pytest

MARKER = "deterministic"
RESUME_MARKER = "resume_equivalent"
REFERENCE_MARKER = "matches_reference"
_REFERENCE_OPTION_NAMES = ("tolerance", "seed", "deterministic", "strict")
DEFAULT_REPEATS = 3
_OPTION_NAMES = ("repeats", "seed", "deterministic", "strict")


@dataclass
class _Session:
    off: bool
    repeats: int
    checked: int = 0
    differed: list[str] = field(default_factory=list)
    resumes: int = 0
    resumes_differed: list[str] = field(default_factory=list)
    save_references: bool = False
    references: int = 0
    references_drifted: list[str] = field(default_factory=list)


_SESSION = pytest.StashKey[_Session]()


def pytest_addoption(parser) -> None:
    group = parser.getgroup("detaudit", "bitwise reproducibility of training steps (detaudit)")
    group.addoption(
        "--no-detaudit",
        action="store_true",
        dest="detaudit_off",
        help="run deterministic-marked steps once, without checking that they reproduce",
    )
    group.addoption(
        "--detaudit-repeats",
        type=int,
        dest="detaudit_repeats",
        metavar="N",
        help=f"runs of each step to compare (default: ini detaudit_repeats, else {DEFAULT_REPEATS})",
    )
    group.addoption(
        "--detaudit-save-references",
        action="store_true",
        dest="detaudit_save_references",
        help="write (or refresh) the references matches_reference tests compare with, instead of comparing",
    )
    parser.addini("detaudit_repeats", f"runs of each deterministic step to compare (default {DEFAULT_REPEATS})")


def pytest_configure(config) -> None:
    config.addinivalue_line(
        "markers",
        f"{MARKER}(repeats={DEFAULT_REPEATS}, seed=0, deterministic=False): the test body is a training step "
        "that must be bitwise reproducible; detaudit runs it `repeats` times under one seed and compares every op",
    )
    config.addinivalue_line(
        "markers",
        f"{RESUME_MARKER}(script, interrupt_at, resume_args='', preset=None, steps=None, script_args=()): "
        "the script, interrupted after step interrupt_at and resumed, must continue exactly as a run never "
        "interrupted (detaudit.audit_resume); checked before the test body runs",
    )
    config.addinivalue_line(
        "markers",
        f"{REFERENCE_MARKER}(folder, tolerance=None, seed=0, deterministic=False): the test body is a training step "
        "that must give bitwise (or within tolerance) the results of the reference in folder (from the test file's "
        "directory); --detaudit-save-references writes it",
    )
    repeats = config.getoption("detaudit_repeats") or int(config.getini("detaudit_repeats") or DEFAULT_REPEATS)
    if repeats < 2:
        raise pytest.UsageError(f"--detaudit-repeats must be at least 2, got {repeats}")
    config.stash[_SESSION] = _Session(
        off=bool(config.getoption("detaudit_off")), repeats=repeats,
        save_references=bool(config.getoption("detaudit_save_references")),
    )


def pytest_report_header(config) -> str:
    session = config.stash[_SESSION]
    if session.off:
        return "detaudit: off (--no-detaudit): deterministic steps run once, unchecked"
    return (
        f"detaudit: deterministic steps run {session.repeats}x under one seed, compared op by op "
        "(--no-detaudit to skip)"
    )


def _options(session: _Session, marker) -> dict:
    options = {"repeats": session.repeats, "seed": 0, "deterministic": False, "strict": False}
    if marker is not None:
        unknown = sorted(set(marker.kwargs) - set(_OPTION_NAMES))
        if unknown or marker.args:
            pytest.fail(
                f"@pytest.mark.{MARKER} takes only keyword arguments {', '.join(_OPTION_NAMES)}; "
                f"got {', '.join(unknown) or repr(marker.args)}",
                pytrace=False,
            )
        options.update(marker.kwargs)
    return options


def _check(session: _Session, name: str, step, options: dict, setup=None):
    """Run ``step`` under assert_deterministic, counting what it found."""
    __tracebackhide__ = True
    from detaudit.testing import assert_deterministic

    session.checked += 1
    try:
        return assert_deterministic(step, setup=setup, **options)
    except AssertionError as difference:
        session.differed.append(name)
        pytest.fail(str(difference), pytrace=False)  # the report says where; detaudit's frames would not


@pytest.fixture
def deterministic(request):
    """``deterministic(step, **options)`` checks that the zero-argument
    ``step`` (which builds what it trains) is bitwise reproducible and returns
    detaudit's report; with --no-detaudit it runs ``step`` once and returns
    None.  Options (repeats, seed, deterministic, strict) default to the test's
    ``@pytest.mark.deterministic(...)`` arguments."""
    session = request.config.stash[_SESSION]
    defaults = _options(session, request.node.get_closest_marker(MARKER))

    def check(step, **options):
        __tracebackhide__ = True
        if session.off:
            step()
            return None
        return _check(session, request.node.nodeid, step, {**defaults, **options})

    return check


def _check_resume(session: _Session, config, nodeid: str, tmp_path, script, interrupt_at, resume_args="", **options):
    """``detaudit.audit_resume`` of ``script`` (from the rootdir), in ``tmp_path``; fails unless equivalent."""
    __tracebackhide__ = True
    from detaudit.resume.audit import audit_resume

    options.setdefault("cwd", tmp_path)
    session.resumes += 1
    try:
        report = audit_resume(config.rootpath / script, interrupt_at, resume_args, **options)
    except (TypeError, ValueError, FileNotFoundError) as error:
        pytest.fail(f"{RESUME_MARKER}: {error}", pytrace=False)
    if report.verdict != "equivalent":
        session.resumes_differed.append(nodeid)
        pytest.fail(report.text(), pytrace=False)
    return report


@pytest.fixture
def resume_equivalent(request, tmp_path):
    """``resume_equivalent(script, interrupt_at, resume_args="", **options)``
    checks that ``script`` resumed after step ``interrupt_at`` continues exactly
    as it does uninterrupted (``detaudit.audit_resume``'s options) and returns
    the report; the test fails with it otherwise.  With --no-detaudit it
    checks nothing and returns None."""
    session = request.config.stash[_SESSION]

    def check(script, interrupt_at, resume_args="", **options):
        __tracebackhide__ = True
        if session.off:
            return None
        return _check_resume(session, request.config, request.node.nodeid, tmp_path, script, interrupt_at,
                             resume_args, **options)

    return check


def _check_reference(session: _Session, item, step, folder, setup=None, **options):
    """``assert_matches_reference`` of ``step`` against ``folder`` (from the test
    file's directory), or the reference written with --detaudit-save-references."""
    __tracebackhide__ = True
    from detaudit.testing import assert_matches_reference

    unknown = sorted(set(options) - set(_REFERENCE_OPTION_NAMES))
    if unknown:
        pytest.fail(f"{REFERENCE_MARKER} takes the folder and {', '.join(_REFERENCE_OPTION_NAMES)}; got {', '.join(unknown)}",
                    pytrace=False)
    session.references += 1
    try:
        return assert_matches_reference(step, item.path.parent / folder, save=session.save_references, setup=setup, **options)
    except AssertionError as drift:
        session.references_drifted.append(item.nodeid)
        pytest.fail(str(drift), pytrace=False)


@pytest.fixture
def matches_reference(request):
    """``matches_reference(step, folder, **options)`` checks that the
    zero-argument ``step`` gives the results of the reference in ``folder``
    (tolerance, seed, deterministic, strict) and returns the report; with
    --detaudit-save-references it writes the reference; with --no-detaudit it
    runs ``step`` once and returns None."""
    session = request.config.stash[_SESSION]

    def check(step, folder, **options):
        __tracebackhide__ = True
        if session.off:
            step()
            return None
        return _check_reference(session, request.node, step, folder, **options)

    return check


def pytest_collection_modifyitems(items) -> None:
    for item in items:  # a resume_equivalent test runs its audit in its own tmp_path
        if item.get_closest_marker(RESUME_MARKER) is not None and "tmp_path" not in item.fixturenames:
            item.fixturenames.append("tmp_path")


@pytest.hookimpl(hookwrapper=True)
def pytest_pyfunc_call(pyfuncitem):
    """A resume_equivalent test's audit runs before its body.  A
    deterministic-marked test that does not use the fixture is its own step:
    the test function is swapped for one that runs it under the check."""
    session = pyfuncitem.config.stash[_SESSION]
    resume = pyfuncitem.get_closest_marker(RESUME_MARKER)
    if resume is not None and not session.off:
        __tracebackhide__ = True
        _check_resume(session, pyfuncitem.config, pyfuncitem.nodeid, pyfuncitem.funcargs["tmp_path"],
                      *resume.args, **resume.kwargs)
    marker = pyfuncitem.get_closest_marker(MARKER)
    reference = pyfuncitem.get_closest_marker(REFERENCE_MARKER)
    if marker is not None and "deterministic" not in pyfuncitem.fixturenames:
        options = _options(session, marker)

        def check(step, restore):
            _check(session, pyfuncitem.nodeid, step, options, restore)
    elif reference is not None and "matches_reference" not in pyfuncitem.fixturenames:
        if not reference.args:
            pytest.fail(f"@pytest.mark.{REFERENCE_MARKER} needs the reference's folder", pytrace=False)

        def check(step, restore):
            _check_reference(session, pyfuncitem, step, *reference.args, setup=restore, **reference.kwargs)
    else:
        check = None
    if check is None or session.off:
        yield
        return
    test_function = pyfuncitem.obj

    @functools.wraps(test_function)
    def checked(**fixture_values):
        __tracebackhide__ = True
        saved = _TorchState(fixture_values.values())

        def step():
            return test_function(**fixture_values)

        step.__qualname__ = test_function.__qualname__  # the report names the test, not this wrapper
        check(step, saved.restore)

    pyfuncitem.obj = checked
    try:
        yield
    finally:
        pyfuncitem.obj = test_function


def pytest_terminal_summary(terminalreporter) -> None:
    session = terminalreporter.config.stash[_SESSION]
    if session.checked:
        differed = f", {len(session.differed)} differed" if session.differed else ""
        terminalreporter.write_line(
            f"detaudit: {session.checked} step(s) checked for bitwise reproducibility{differed}"
        )
    if session.resumes:
        differed = f", {len(session.resumes_differed)} not equivalent" if session.resumes_differed else ""
        terminalreporter.write_line(f"detaudit: {session.resumes} resume(s) checked against uninterrupted runs{differed}")
    if session.references:
        if session.save_references:
            terminalreporter.write_line(f"detaudit: {session.references} reference(s) written")
        else:
            drifted = f", {len(session.references_drifted)} drifted" if session.references_drifted else ""
            terminalreporter.write_line(f"detaudit: {session.references} step(s) compared with their references{drifted}")


class _TorchState:
    """The state of the torch modules, optimizers and tensors among a test's
    fixture values, to put back before each repeat (a repeat that trained the
    fixture's model would otherwise hand the next one other weights)."""

    def __init__(self, values):
        import sys

        torch = sys.modules.get("torch")  # a fixture holding torch objects has imported it
        self._restores = []
        if torch is None:
            return
        for value in values:
            if isinstance(value, torch.nn.Module):
                self._restores.extend(self._tensor_restore(t) for t in [*value.parameters(), *value.buffers()])
            elif isinstance(value, torch.optim.Optimizer):
                self._restores.append(self._optimizer_restore(value))
            elif isinstance(value, torch.Tensor):
                self._restores.append(self._tensor_restore(value))

    @staticmethod
    def _tensor_restore(tensor):
        import torch

        data = tensor.detach().clone()
        leaf = tensor.is_leaf  # only leaves keep a .grad
        grad = None if not leaf or tensor.grad is None else tensor.grad.detach().clone()

        def restore():
            with torch.no_grad():
                tensor.copy_(data)
            if leaf:
                tensor.grad = None if grad is None else grad.clone()

        return restore

    @staticmethod
    def _optimizer_restore(optimizer):
        import copy

        state = copy.deepcopy(optimizer.state_dict())
        return lambda: optimizer.load_state_dict(copy.deepcopy(state))

    def restore(self) -> None:
        for restore in self._restores:
            restore()
