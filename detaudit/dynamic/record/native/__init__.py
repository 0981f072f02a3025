"""The compiled op recorder, ``recorder.cpp``: how it is built and loaded.

``OpTracer.record`` (``record/tracer.py``) is the reference; the compiled recorder
does the same on the same state for the common op, at about a third of the
added cost per op, and hands it the rest.  The same library holds the
compiled storage tables (``storage_tables.py``'s twin), which a tracer uses
from both recorders when the library loads.  It is built on first use
against the installed torch's headers (every torch wheel carries them) with the system's C++ compiler
(``$CXX``, else ``c++``), into a cache folder: ``$DETAUDIT_NATIVE_CACHE``,
else ``$XDG_CACHE_HOME/detaudit/native``, else ``~/.cache/detaudit/native``.
One build per source, torch and Python; builds are serialized by a file lock
and land atomically, so concurrent runs never load half a library.  A build
that failed is not retried (its log stays beside it).  Where there is no
library the tracer records in Python: the same trace, slower.
``DETAUDIT_NATIVE=0`` turns the compiled recorder off.

``library_path`` and ``ensure_built`` import no torch: ``detaudit run``'s
parent builds before it starts the runs (in a subprocess that imports torch),
so no run's time limit pays for a build.  ``load`` is for the process that
traces, where torch is imported.
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
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
_loaded = None  # the configured module, False once it could not be loaded in this process


def enabled() -> bool:
    """Off with ``DETAUDIT_NATIVE=0``, and where the build's file lock and compiler flags do not apply (not POSIX)."""
    return os.environ.get("DETAUDIT_NATIVE", "1") != "0" and os.name == "posix"


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


def ensure_built(announce: Callable[[str], None] | None = None) -> bool:
    """Build the library unless it exists, failed before or is turned off; in a
    subprocess (torch is imported there, not here).  ``announce`` is told
    before a build starts.  Whether the library exists now."""
    library = library_path() if enabled() else None
    if library is None:
        return False
    if not library.exists() and not _failure_log(library).exists() and shutil.which(_compiler()):
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
        if _failure_log(library).exists():
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
                _failure_log(library).write_text(" ".join(command) + "\n\n" + (failure or "no output file"))
                return None
            os.replace(partial, library)
    return library


def load():
    """The compiled recorder module, configured with tracer.py's constants, in
    the tracing process (torch imported); built first if need be.  None where
    it is turned off or cannot be built or loaded."""
    global _loaded
    if _loaded is None:
        _loaded = _load() or False
    return _loaded or None


def _load():
    library = library_path() if enabled() else None
    if library is None:
        return None
    if not library.exists() and build() is None:
        return None
    try:
        loader = importlib.machinery.ExtensionFileLoader(MODULE_NAME, str(library))
        spec = importlib.util.spec_from_file_location(MODULE_NAME, library, loader=loader)
        module = importlib.util.module_from_spec(spec)
        loader.exec_module(module)
    except (ImportError, OSError):  # built against another torch or libc than this process has
        return None
    from detaudit.dynamic.record import tracer

    module.configure(tracer.native_constants())
    return module


if __name__ == "__main__":
    sys.exit(0 if build() else 1)
