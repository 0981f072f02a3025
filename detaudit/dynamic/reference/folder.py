"""The reference folder: what a later run needs to compare itself with this one.

A plain folder, meant to be committed or kept as a CI artifact::

    manifest.json          what ran (script, arguments, steps, seed), where (the
                           full environment fingerprint), the final state's digests,
                           and each file's size
    trace.json.gz          the op trace (ops, digests, lines, modules, phases)
    first_steps.pt.gz      the tensors of the first steps' ops, as run 1 of an audit
                           keeps them (``record/online_capture.py``), up to
                           ``FIRST_STEPS_BYTES``
    state.pt.gz            the final state's tensors (to measure a drift's size)

``save`` writes it from a finished traced run (into a sibling folder, then
renamed: a folder half written is never left as the reference); ``load``
unpacks it into a working directory for ``runner.py``.  A folder written by
another format version, or not a reference at all, is a ``ReferenceFolderError``
with one line saying so.
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

FORMAT = 1
# what the reference keeps of its first steps' tensors, before compression: enough for the first
# ops to depart (a drift at initialisation, the first forward), small enough to commit
FIRST_STEPS_BYTES = 16 << 20
MANIFEST = "manifest.json"
# payload key of a traced run -> the file it is kept as
_KEPT_FILES = {"trace_file": "trace.json.gz", "online_capture_file": "first_steps.pt.gz", "state_file": "state.pt.gz"}


class ReferenceFolderError(Exception):
    """A reference folder that cannot be read or written."""


@dataclass
class Reference:
    """A reference unpacked for a comparison: its manifest and its files' paths."""

    folder: Path
    manifest: dict
    trace_file: str
    state_file: str
    first_steps_file: str | None  # None when the run kept no first steps

    @property
    def environment(self) -> dict:
        return self.manifest["environment"]

    @property
    def state_digests(self) -> dict:
        return self.manifest["state_digests"]

    def summary(self) -> dict:
        """What a report says of the reference it compared with."""
        keys = ("script", "script_args", "steps", "seed", "created", "detaudit", "size_bytes")
        return {"folder": str(self.folder), **{key: self.manifest.get(key) for key in keys}}


def save(folder: str | Path, payload: dict, *, script: str, script_args, steps: int, seed, deterministic: bool) -> dict:
    """Keep a finished traced run (its ``payload``: trace, online capture,
    state and digests, environment) as a reference in ``folder``, replacing
    a reference already there; returns the manifest.  Anything else already
    in ``folder`` is an error: a reference never overwrites other files."""
    from detaudit import __version__

    target = Path(folder)
    check_writable(target)
    partial = target.with_name(target.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    sizes = {}
    for key, name in _KEPT_FILES.items():
        source = payload.get(key)
        if source:
            _compress(source, partial / name)
            sizes[name] = (partial / name).stat().st_size
    manifest = {
        "format": FORMAT,
        "detaudit": __version__,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "script": script,
        "script_args": list(script_args),
        "steps": steps,
        "seed": seed,
        "deterministic": deterministic,
        "steps_run": payload.get("steps"),
        "environment": payload.get("environment", {}),
        "recorder": payload.get("recorder"),
        "state_digests": payload["state_digests"],
        "files": sizes,
    }
    manifest["size_bytes"] = sum(sizes.values())  # the files above; the manifest adds a few kB
    (partial / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n", encoding="utf-8")
    if target.exists():
        shutil.rmtree(target)
    os.replace(partial, target)
    return manifest


def check_writable(folder: str | Path) -> None:
    """``ReferenceFolderError`` unless ``folder`` is absent, empty or a reference
    (checked before any run, so that a refusal costs nothing)."""
    target = Path(folder)
    if target.exists() and not (target.is_dir() and (not any(target.iterdir()) or (target / MANIFEST).is_file())):
        raise ReferenceFolderError(f"{target}: exists and is not a reference folder (refusing to overwrite it)")


def read_manifest(folder: str | Path) -> dict:
    """The manifest of a reference folder; ``ReferenceFolderError`` when there is none or it is another format."""
    path = Path(folder) / MANIFEST
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ReferenceFolderError(f"{folder}: not a reference folder (no {MANIFEST}; write one with --save-reference)") from None
    except (OSError, ValueError) as error:
        raise ReferenceFolderError(f"{path}: unreadable ({error})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise ReferenceFolderError(
            f"{folder}: a reference of format {manifest.get('format') if isinstance(manifest, dict) else '?'}, "
            f"this detaudit reads format {FORMAT}: save it again with --save-reference"
        )
    return manifest


def load(folder: str | Path, workdir: str | Path) -> Reference:
    """Unpack the reference in ``folder`` into ``workdir`` (the files a run's
    payload would name) for a comparison."""
    manifest = read_manifest(folder)
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    unpacked = {}
    for key, name in _KEPT_FILES.items():
        packed = Path(folder) / name
        if name not in manifest["files"]:
            unpacked[key] = None
            continue
        if not packed.is_file():
            raise ReferenceFolderError(f"{folder}: {name} is missing (the manifest lists it)")
        unpacked[key] = str(workdir / name.removesuffix(".gz"))
        try:
            with gzip.open(packed, "rb") as source, open(unpacked[key], "wb") as out:
                shutil.copyfileobj(source, out)
        except (OSError, EOFError) as error:
            raise ReferenceFolderError(f"{packed}: unreadable ({error})") from None
    if unpacked["trace_file"] is None or unpacked["state_file"] is None:
        raise ReferenceFolderError(f"{folder}: the reference has no trace or no final state")
    return Reference(Path(folder), manifest, unpacked["trace_file"], unpacked["state_file"], unpacked["online_capture_file"])


def _compress(source: str, target: Path) -> None:
    with open(source, "rb") as raw, gzip.open(target, "wb", compresslevel=6) as out:
        shutil.copyfileobj(raw, out)
