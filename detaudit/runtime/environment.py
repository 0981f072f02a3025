"""The determinism fingerprint of the current process.

``fingerprint()`` reads every setting that decides whether this process
computes the same bits as another one: versions, devices, torch's determinism
switches, the TF32/fp32-precision tree, thread counts and the environment
variables that matter.  The dynamic pass stores it in its run report (so two
runs can be compared setting by setting) and ``detaudit.status()`` renders it.

Reading the fingerprint changes nothing:

* CUDA is never initialised just to read flags.  Device names and capabilities
  need an initialised CUDA context, so they are read only when the process
  already initialised CUDA (or when the caller passes ``initialize_cuda=True``).
  Initialising CUDA as a side effect would break a later ``fork`` and would
  make ``CUBLAS_WORKSPACE_CONFIG`` too late to set on older torch.
* ``torch._inductor`` is read only when it is already imported (importing it
  costs about a second); its defaults come from the ``TORCHINDUCTOR_*``
  environment variables, which are always recorded.

The result is a flat ``dict`` whose keys are the dotted names users know
(``"torch.backends.cudnn.benchmark"``, ``"env.PYTHONHASHSEED"``), so two
fingerprints diff key by key and serialise to JSON as they are.  Values are
``bool``/``int``/``str``/``list``/``None`` (``None``: unset environment
variable).  A setting this torch does not have is left out; a getter that
raises is recorded as the string ``"error: <ExceptionType>: <message>"``.
"""

from __future__ import annotations

import functools
import os
import platform
import re
import sys
from typing import Any, Callable, Iterable

from detaudit.knowledge.backend_settings import Setting, backend_settings
from detaudit.knowledge.versions import version_in_range
from detaudit.launch.child_settings import CHILD_SETTINGS
from detaudit.runtime.settings import reader

# Environment variables recorded whether set or not (None when unset), so that
# "set in one run, unset in the other" shows up in a diff: these, the child
# settings detaudit makes as variables and the settings table's variables.
DETERMINISM_ENV_VARS = (
    *(setting.environment for setting in CHILD_SETTINGS.values() if setting.environment),
    *(s.spellings[0].environment for s in backend_settings().settings if s.spellings[0].environment),
    "CUDA_LAUNCH_BLOCKING",
    "NCCL_ALGO",
    "NCCL_PROTO",
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
)
# Every variable with one of these prefixes is recorded when set.
DETERMINISM_ENV_PREFIXES = ("TORCHINDUCTOR_",)

# What a short summary of a fingerprint always shows: versions, device, threads, hash seed.
SUMMARY_KEYS = (
    "torch.version",
    "torch.version.cuda",
    "torch.version.hip",
    "python.version",
    "numpy.version",
    "torch.cuda.is_available",
    "torch.cuda.devices",
    "torch.get_num_threads",
    "env.PYTHONHASHSEED",
)
# ... and the switch that decides deterministic kernels, set or not
_ALWAYS_SHOWN_SETTINGS = ("deterministic-algorithms",)

ERROR_PREFIX = "error: "
_MAX_ERROR_CHARS = 160


def fingerprint(*, initialize_cuda: bool = False) -> dict[str, Any]:
    """The determinism-relevant state of this process, as a flat dict.

    ``initialize_cuda=True`` allows initialising CUDA to read device names;
    by default CUDA is left exactly as it was (see the module docstring).
    """
    result: dict[str, Any] = {
        "python.version": platform.python_version(),
        "platform": platform.platform(),
        "cpu.model": _cpu_model(),
        # 0 only when PYTHONHASHSEED=0 was set before the interpreter started
        "python.hash_randomization": bool(sys.flags.hash_randomization),
    }
    try:
        import torch
    except ImportError:
        result["torch.version"] = None
    else:
        result.update(_torch_readings(torch, initialize_cuda=initialize_cuda))
    numpy = sys.modules.get("numpy")
    if numpy is None:
        try:
            import numpy
        except ImportError:
            numpy = None
    result["numpy.version"] = getattr(numpy, "__version__", None)
    result.update(environment_variables())
    return result


def summary(settings: dict[str, Any], also: Iterable[str] = ()) -> dict[str, Any]:
    """The part of a fingerprint that decides reproducibility, for a one-line
    report: ``SUMMARY_KEYS`` (unset CUDA versions left out), deterministic
    algorithms, every setting of the table that differs from its default or
    has a risky value where it matters, and the keys in ``also`` (what differs
    between the runs being compared).  The full fingerprint stays in JSON."""
    table = backend_settings()
    keys = [key for key in SUMMARY_KEYS if key in settings and (settings[key] is not None or key.startswith("env."))]
    keys += [table[setting_id].key for setting_id in _ALWAYS_SHOWN_SETTINGS]
    for setting in table.settings:
        if setting.key not in settings or setting.key.startswith("env."):
            continue
        value = settings[setting.key]
        changed = setting.default is not None and not is_error(value) and value != setting.default
        if changed or risky_here(setting, settings):
            keys.append(setting.key)
    keys += also
    return {key: settings.get(key) for key in dict.fromkeys(keys) if key in settings}


def risky_here(setting: Setting, settings: dict[str, Any]) -> bool:
    """The setting was read, has a risky value, and that value matters in this
    process: CUDA settings only where CUDA is available (oneDNN's on any CPU),
    version-bound ones only on those torch versions, dependent ones only while
    the setting they depend on is at its safe value."""
    if setting.key not in settings or not setting.is_risky(settings[setting.key]):
        return False
    matters = setting.matters
    if matters.devices is not None and "cpu" not in matters.devices and not settings.get("torch.cuda.is_available"):
        return False
    if matters.torch is not None:
        version = settings.get("torch.version")
        if not version or not version_in_range(version, matters.torch):
            return False
    if matters.requires is not None:
        required = backend_settings()[matters.requires]
        return settings.get(required.key) == required.safe
    return True


def environment_variables() -> dict[str, str | None]:
    """``env.NAME`` for the recorded variables (see DETERMINISM_ENV_VARS)."""
    names = list(DETERMINISM_ENV_VARS)
    names += sorted(n for n in os.environ if n.startswith(DETERMINISM_ENV_PREFIXES))
    return {f"env.{name}": os.environ.get(name) for name in names}


def version_tuple(version: str) -> tuple[int, int]:
    """``(major, minor)`` of a version string (``"2.9.0a0+git1234"`` -> ``(2, 9)``)."""
    major, minor = (version.split(".") + ["0"])[:2]
    return int(major), int("".join(ch for ch in minor if ch.isdigit()) or 0)


def is_error(value: Any) -> bool:
    """True for the marker of a getter that raised (see the module docstring)."""
    return isinstance(value, str) and value.startswith(ERROR_PREFIX)


_ABSENT = object()  # marks a setting this torch does not have


def _read(getter: Callable[[], Any]) -> Any:
    """Run one getter; AttributeError means "this torch has no such setting"."""
    try:
        return getter()
    except AttributeError:
        return _ABSENT
    except Exception as error:  # torch raises RuntimeError when TF32 APIs were mixed
        message = " ".join(str(error).split())
        if len(message) > _MAX_ERROR_CHARS:
            message = message[: _MAX_ERROR_CHARS - 3] + "..."
        return f"{ERROR_PREFIX}{type(error).__name__}: {message}"


def _torch_readings(torch: Any, *, initialize_cuda: bool) -> dict[str, Any]:
    readings: list[tuple[str, Callable[[], Any]]] = [
        ("torch.version", lambda: torch.__version__),
        ("torch.version.cuda", lambda: torch.version.cuda),
        ("torch.version.hip", lambda: torch.version.hip),
        ("torch.backends.cudnn.version", lambda: torch.backends.cudnn.version()),
        ("torch.cuda.is_available", lambda: torch.cuda.is_available()),
        ("torch.cuda.is_initialized", lambda: torch.cuda.is_initialized()),
        ("torch.cuda.device_count", lambda: torch.cuda.device_count()),
        ("torch.cuda.devices", lambda: _cuda_devices(torch, initialize_cuda)),
    ]
    # Every setting of the table in table order, which reads the fp32_precision
    # tree (torch >= 2.9) before the legacy TF32 getters: those raise once code
    # mixed the two APIs.  Variables are recorded with the environment.
    for setting in backend_settings().settings:
        get = reader(torch, setting)
        if get is not None:
            readings.append((setting.key, get))
    readings += [
        ("torch.get_num_threads", torch.get_num_threads),
        ("torch.get_num_interop_threads", torch.get_num_interop_threads),
        # the vector instructions the CPU kernels dispatch to (ATEN_CPU_CAPABILITY caps it):
        # vectorized kernels, torch.randn's included, give other bits under another
        ("torch.backends.cpu.get_cpu_capability", lambda: torch.backends.cpu.get_cpu_capability()),
        ("torch.get_default_dtype", lambda: str(torch.get_default_dtype())),
    ]
    # the libraries the CPU kernels were built with: another BLAS or oneDNN computes matmuls and convolutions
    # in another order (what another machine's torch build brings along)
    readings += [(key, lambda pattern=pattern: _build_setting(torch, pattern)) for key, pattern in BUILD_SETTINGS]
    result = {}
    for key, getter in readings:
        value = _read(getter)
        if value is not _ABSENT:
            result[key] = value
    return result


#: fingerprint key -> what torch.__config__.show() says of it (a regular expression, its first group)
BUILD_SETTINGS = (
    ("torch.build.commit", r"COMMIT_SHA=([0-9a-f]+)"),
    ("torch.build.blas", r"BLAS_INFO=([^,\s]+)"),
    ("torch.build.mkl", r"Math Kernel Library Version ([^\s]+)"),
    ("torch.build.onednn", r"MKL-DNN (v[^\s]+)"),
)


def _build_setting(torch: Any, pattern: str) -> str:
    match = re.search(pattern, _config_text(torch))
    if match is None:
        raise AttributeError("not in this build's configuration")  # (left out of the fingerprint)
    return match.group(1)


@functools.lru_cache(maxsize=1)
def _config_text(torch: Any) -> str:
    return torch.__config__.show()


def _cpu_model() -> str:
    """The CPU's model name (Linux's /proc/cpuinfo; else what platform says)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.partition(":")[2].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _cuda_devices(torch: Any, initialize_cuda: bool) -> list[str]:
    if not (torch.cuda.is_initialized() or (initialize_cuda and torch.cuda.is_available())):
        raise AttributeError("device names need an initialised CUDA context")
    devices = []
    for index in range(torch.cuda.device_count()):
        major, minor = torch.cuda.get_device_capability(index)
        devices.append(f"{torch.cuda.get_device_name(index)} (sm_{major}{minor})")
    return devices
