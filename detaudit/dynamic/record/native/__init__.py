"""The compiled op recorder, ``recorder.cpp``: how it is built and loaded.

``OpTracer.record`` (``record/tracer.py``) is the reference; the compiled recorder
does the same on the same state for the common op, at about a third of the
added cost per op, and hands it the rest.  The same library holds the
compiled storage tables (``storage_tables.py``'s twin), which a tracer uses
from both recorders when the library loads, and ``words_digest``, the sum
``digests.host_digest`` takes of a large tensor's words (numpy's, to the
bit).  It is built on first use against the installed torch's headers (every torch wheel carries them) with the system's C++ compiler
(``$CXX``, else ``c++``), into a cache folder: ``$DETAUDIT_NATIVE_CACHE``,
else ``$XDG_CACHE_HOME/detaudit/native``, else ``~/.cache/detaudit/native``.
One build per source, torch and Python; builds are serialized by a file lock
and land atomically, so concurrent runs never load half a library.  The
build is hand-rolled rather than ``torch.utils.cpp_extension.load`` because
that one needs ninja, which a training environment rarely has.  A build that
failed leaves its log beside the library, with what it was built with (the
compiler, Python's and torch's headers): it is not retried until one of those
changes.  Where there is no library the tracer records in Python: the same
trace, slower; ``unavailable_reason()`` says why, and the run report shows it
(``detaudit.recorder`` in its environment).  ``DETAUDIT_NATIVE=0`` turns the
compiled recorder off.

``library_path`` and ``ensure_built`` import no torch: ``detaudit run``'s
parent builds before it starts the runs (in a subprocess that imports torch),
so no run's time limit pays for a build.  ``load`` is for the process that
traces, where torch is imported.
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path
from typing import Callable

SOURCE = Path(__file__).with_name("recorder.cpp")
MODULE_NAME = "native_record"
BUILD_TIMEOUT_S = 300
_loaded = None  # the module, False once it could not be loaded in this process
_unavailable = ""  # why it could not (load() sets it)


def disabled_reason() -> str:
    """Why the compiled recorder is off here, "" where it may be used: off with
    ``DETAUDIT_NATIVE=0``, and where the build's file lock and compiler flags
    do not apply (not POSIX)."""
    if os.environ.get("DETAUDIT_NATIVE", "1") == "0":
        return "DETAUDIT_NATIVE=0"
    if os.name != "posix":
        return "not built on this platform (POSIX only)"
    return ""


def _compiler() -> str:
    return os.environ.get("CXX") or "c++"


def _torch_dir() -> Path | None:
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def _cache_dir() -> Path:
    if os.environ.get("DETAUDIT_NATIVE_CACHE"):
        return Path(os.environ["DETAUDIT_NATIVE_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "detaudit" / "native"


def library_path() -> Path | None:
    """Where the library for this source, torch and Python is (or would be
    built); None without torch."""
    torch_dir = _torch_dir()
    if torch_dir is None:
        return None
    key = hashlib.sha256()
    key.update(SOURCE.read_bytes())
    key.update(str(torch_dir.resolve()).encode())
    version_file = torch_dir / "version.py"
    key.update(version_file.read_bytes() if version_file.exists() else b"")
    key.update(sys.version.encode())
    return _cache_dir() / f"{MODULE_NAME}-{key.hexdigest()[:16]}{sysconfig.get_config_var('EXT_SUFFIX')}"


def _failure_log(library: Path) -> Path:
    return library.with_name(library.name + ".failed.log")


def _build_inputs() -> dict:
    """What a build depends on beyond the library's key (source, torch,
    Python): the compiler and the headers, each as path and modification
    time, so a failed build is retried once any of them changes (a compiler
    or python3-dev installed, torch's headers restored)."""

    def stamp(path: str | Path | None) -> list:
        if path is None:
            return [None]
        try:
            status = os.stat(path)
        except OSError:
            return [str(path), None]
        return [os.path.realpath(path), status.st_mtime_ns, status.st_size]

    torch_dir = _torch_dir()
    return {
        "compiler": stamp(shutil.which(_compiler())),
        "python_headers": stamp(Path(sysconfig.get_paths()["include"]) / "Python.h"),
        "torch_headers": stamp(torch_dir / "include" if torch_dir else None),
    }


#: the failure log's last line: what the build was made with (``_build_inputs``)
_INPUTS_LINE = "build inputs: "


def failed_build(library: Path) -> Path | None:
    """The log of the build that failed with what a build would use now, else
    None; a log of a build with other inputs is removed (a later build may
    succeed)."""
    log = _failure_log(library)
    try:
        last_line = log.read_text().rstrip("\n").rpartition("\n")[2]
    except OSError:
        return None
    try:
        recorded = json.loads(last_line.removeprefix(_INPUTS_LINE))
    except ValueError:  # a log of an older detaudit: inputs unknown, so try again
        recorded = None
    if recorded == _build_inputs():
        return log
    log.unlink(missing_ok=True)
    return None


def ensure_built(announce: Callable[[str], None] | None = None) -> bool:
    """Build the library unless it exists, failed before with the same inputs
    or is turned off; in a subprocess (torch is imported there, not here).
    ``announce`` is told before a build starts.  Whether the library exists now."""
    library = None if disabled_reason() else library_path()
    if library is None:
        return False
    if not library.exists() and failed_build(library) is None and shutil.which(_compiler()):
        if announce is not None:
            announce(f"building the tracer's compiled op recorder into {library.parent} (once per torch; about 20 s)")
        try:
            subprocess.run(
                [sys.executable, "-m", "detaudit.dynamic.record.native"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=BUILD_TIMEOUT_S + 60, check=False,
            )
        except (OSError, subprocess.TimeoutExpired):
            return False
    return library.exists()


def _compile_command(source: Path, output: Path) -> list[str]:
    import torch
    from torch.utils import cpp_extension

    torch_lib = Path(torch.__file__).parent / "lib"
    return [
        _compiler(), "-O2", "-shared", "-fPIC", "-std=c++17", "-w",
        f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}",
        *(f"-I{path}" for path in cpp_extension.include_paths()),
        f"-I{sysconfig.get_paths()['include']}",
        str(source), "-o", str(output),
        f"-L{torch_lib}", "-lc10", "-ltorch", "-ltorch_cpu", "-ltorch_python", f"-Wl,-rpath,{torch_lib}",
    ]


def build() -> Path | None:
    """Compile the library (imports torch), one process at a time; its path,
    or None if it failed, or there is no compiler or no writable cache (then
    nothing is recorded, and a later call tries again)."""
    library = library_path()
    if library is None or shutil.which(_compiler()) is None:
        return None
    try:
        return _build(library)
    except OSError:  # the cache folder cannot be made or written
        return None


def _build(library: Path) -> Path | None:
    import fcntl

    library.parent.mkdir(parents=True, exist_ok=True)
    with open(library.with_name(library.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another process may be building it: wait, then use its result
        if library.exists():
            return library
        if failed_build(library) is not None:
            return None
        with tempfile.TemporaryDirectory(dir=library.parent) as work:
            partial = Path(work) / library.name
            command = _compile_command(SOURCE, partial)
            try:
                done = subprocess.run(command, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
                failure = None if done.returncode == 0 else done.stderr[-20000:]
            except (OSError, subprocess.TimeoutExpired) as error:
                failure = str(error)
            if failure is not None or not partial.exists():
                _failure_log(library).write_text(
                    " ".join(command) + "\n\n" + (failure or "no output file").rstrip("\n")
                    + f"\n\n{_INPUTS_LINE}{json.dumps(_build_inputs())}\n"
                )
                return None
            os.replace(partial, library)
    return library


def load():
    """The compiled recorder module in the tracing process (torch imported),
    built first if need be; the tracer configures it.  None where it is
    turned off or cannot be built or loaded: ``unavailable_reason()`` says why."""
    global _loaded, _unavailable
    if _loaded is None:
        module, _unavailable = _load()
        _loaded = module or False
    return _loaded or None


def loaded():
    """The compiled module if this process has loaded it already, else None
    (never builds): for code that only runs faster with it (``digests.host_digest``)."""
    return _loaded or None


def unavailable_reason() -> str:
    """Why ``load()`` found no compiled recorder ("" when it did, or was not asked)."""
    return _unavailable


def _load():
    """(module, "") or (None, why not)."""
    reason = disabled_reason()
    if reason:
        return None, reason
    library = library_path()
    if library is None:
        return None, "torch was not found"
    if not library.exists():
        if shutil.which(_compiler()) is None:
            return None, f"no C++ compiler ({_compiler()!r} not found; set $CXX)"
        if build() is None:
            log = _failure_log(library)
            return None, f"its build failed (log: {log})" if log.exists() else "it could not be built"
    try:
        loader = importlib.machinery.ExtensionFileLoader(MODULE_NAME, str(library))
        spec = importlib.util.spec_from_file_location(MODULE_NAME, library, loader=loader)
        module = importlib.util.module_from_spec(spec)
        loader.exec_module(module)
    except (ImportError, OSError) as error:  # built against another torch or libc than this process has
        return None, f"{library} did not load: {error}"
    return module, ""


if __name__ == "__main__":
    sys.exit(0 if build() else 1)
