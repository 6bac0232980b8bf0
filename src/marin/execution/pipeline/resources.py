"""What a step needs (``Resources``) and what a machine has (``ResourcePool``).

A step declares its needs once, ``handle.with_options(resources={"gpu": 1, "memory": "16GiB"})``,
and every runner reads the same value: the local runner counts it against a ``ResourcePool``,
Airflow turns it into pool slots and a pod override, Prefect into global concurrency limits.
Placement is not identity: resources are never part of a step's fingerprint.

Amounts are plain numbers per kind: ``cpu`` (cores, may be fractional), ``memory`` (bytes; written
``"16GiB"``, ``"512MB"`` or ``"16Gi"``), ``gpu`` (a whole count of devices) and any other named
amount (``{"tpu": 8}``), counted like ``cpu``.

The pool's anti-starvation rule is a single *reservation*. The scheduler offers ready steps in
priority order; the first step that does not fit becomes the reservation. While it waits, what is
free is held for it: any other step is granted only from what is free beyond the reservation's
needs (``free - reserved``, per kind). Running steps only ever hand resources back, so the
reserved step's share grows until it fits; then it is granted first and the reservation passes to
the next step that does not fit. A stream of small steps therefore cannot starve a big one, while
small steps still fill whatever the big one cannot use (backfill).
"""

from __future__ import annotations

import math
import os
import re
import shutil
import subprocess
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from marin.execution.errors import InvalidStepError, format_error
from marin.execution.suggest import did_you_mean

__all__ = [
    "MAX_AMOUNT",
    "MAX_MEMORY",
    "MAX_TIMEOUT_S",
    "NO_RESOURCES",
    "Grant",
    "ResourcePool",
    "Resources",
    "capacity_from",
    "check_fits",
    "format_amount",
    "machine_capacity",
    "parse_capacity",
    "parse_duration",
    "parse_memory",
    "parse_resources",
    "visible_gpus",
]

STANDARD_KINDS = ("cpu", "memory", "gpu")
_TYPO = 0.75
"""How like a standard kind a custom one may not be: ``cpus`` (0.86) and ``memroy`` are typos,
``tpu`` and ``npu`` (0.67 from ``gpu``) are kinds of their own."""
_KIND = re.compile(r"^[a-z][a-z0-9_.-]{0,62}$")
_EPS = 1e-9

_MEMORY_UNITS = {
    "": 1,
    "b": 1,
    "k": 1000,
    "kb": 1000,
    "m": 1000**2,
    "mb": 1000**2,
    "g": 1000**3,
    "gb": 1000**3,
    "t": 1000**4,
    "tb": 1000**4,
    "ki": 1024,
    "kib": 1024,
    "mi": 1024**2,
    "mib": 1024**2,
    "gi": 1024**3,
    "gib": 1024**3,
    "ti": 1024**4,
    "tib": 1024**4,
}
_MEMORY = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]*)\s*$")
_DURATION_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_DURATION = re.compile(r"([0-9]+(?:\.[0-9]+)?)\s*([smhd])")


MAX_AMOUNT = 10**15
"""The largest amount of ``cpu``, ``gpu`` or another kind a step may ask for or a pool have."""
MAX_MEMORY = 2**60
"""The largest ``memory``: 1 EiB, in bytes."""
MAX_TIMEOUT_S = 365 * 86400
"""The longest ``timeout``: 365 days (engines' own timeouts overflow on absurd values)."""


def _error(what: str, fix: str, step: str | None) -> InvalidStepError:
    return InvalidStepError(what, fix, step)


def _shown(value: Any) -> str:
    """``repr(value)``, cut short: an error message names the value, it never floods a line."""
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:37]}..."


def _check_kind(kind: str, where: str, step: str | None) -> None:
    """Refuse a kind that reads as a typo of a standard one: counted as a custom kind, it
    would never meet the step's real need, and no capacity would name it."""
    if kind in STANDARD_KINDS:
        return
    hint = did_you_mean(kind, STANDARD_KINDS, n=1, cutoff=_TYPO)
    if hint:
        raise _error(
            f"{where} names the resource kind {kind!r}",
            f"{hint} (the standard kinds are cpu, memory and gpu; a custom kind, such as "
            "tpu, must not look like one of them)",
            step,
        )


def custom_kinds(resources: Resources) -> list[str]:
    """The kinds of ``resources`` other than cpu, memory and gpu (``["tpu"]``)."""
    return [kind for kind, _ in resources.extra]


def _number(value: Any) -> float | None:
    """``value`` as a float, ``±inf`` past any float (``10**400``: refused as too large by the
    caller, never an ``OverflowError``), or ``None`` (NaN; bools are not numbers here)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        number = float(value)
    except OverflowError:  # an int no float can hold
        return math.inf if value > 0 else -math.inf
    return None if math.isnan(number) else number


def _too_large(field_name: str, value: Any, maximum: str, step: str | None) -> InvalidStepError:
    return _error(
        f"{field_name}={_shown(value)} is more than the maximum of {maximum}",
        f"use at most {maximum}",
        step,
    )


def parse_memory(value: Any, step: str | None = None, field_name: str = "resources.memory") -> int:
    """Bytes from ``17179869184``, ``"16GiB"``, ``"16Gi"`` (binary) or ``"16GB"`` (decimal)."""
    number = _number(value)
    if number is None and isinstance(value, str):
        match = _MEMORY.match(value)
        unit = match.group(2).lower() if match else None
        if match and unit in _MEMORY_UNITS:
            number = float(match.group(1)) * _MEMORY_UNITS[unit]  # inf for 400 digits
    if number is None or number < 0:
        raise _error(
            f"{field_name}={_shown(value)} is not an amount of memory",
            'use bytes (an integer) or a string such as "16GiB", "512MiB" or "64GB"',
            step,
        )
    if number > MAX_MEMORY:
        raise _too_large(field_name, value, "1EiB (2**60 bytes)", step)
    return math.ceil(number)


def parse_duration(value: Any, step: str | None = None, field_name: str = "timeout") -> float:
    """Seconds from ``90``, ``"90s"``, ``"30m"``, ``"2h"`` or ``"1h30m"``; > 0, at most 365 days."""
    seconds = _number(value)
    if seconds is None and isinstance(value, str):
        text = value.strip().lower().replace(" ", "")
        parts = _DURATION.findall(text)
        if parts and "".join(n + u for n, u in parts) == text:
            seconds = sum(float(n) * _DURATION_UNITS[u] for n, u in parts)  # inf for 400 digits
    if seconds is None or seconds <= 0:
        raise _error(
            f"{field_name}={_shown(value)} is not a duration",
            'use seconds > 0 (a number) or a string such as "90s", "30m", "2h" or "1h30m"',
            step,
        )
    if seconds > MAX_TIMEOUT_S:
        raise _too_large(field_name, value, f'{MAX_TIMEOUT_S} seconds ("365d")', step)
    return seconds


def format_amount(kind: str, amount: float) -> str:
    """A readable amount: ``memory`` in GiB/MiB, whole numbers without ``.0``."""
    if kind == "memory":
        for unit, size in (("TiB", 1024**4), ("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
            if amount >= size:
                value = amount / size
                text = f"{value:.1f}".rstrip("0").rstrip(".")
                return f"{text}{unit}"
        return f"{int(amount)}B"
    if float(amount).is_integer():
        return str(int(amount))
    return f"{amount:g}"


@dataclass(frozen=True)
class Resources:
    """What one step needs, or what one machine has: an amount per kind (0: none).

    ``extra`` holds the free-form kinds (``(("tpu", 8.0),)``), sorted, so the value is hashable.
    Build one with ``Resources.of(...)`` (or ``parse_resources``), which validates.
    """

    cpu: float = 0.0
    memory: int = 0
    """Bytes."""
    gpu: int = 0
    extra: tuple[tuple[str, float], ...] = field(default=())

    @staticmethod
    def of(value: Any = None, step: str | None = None) -> Resources:
        return parse_resources(value, step)

    def amounts(self) -> dict[str, float]:
        """Every kind with a non-zero amount: ``{"cpu": 4.0, "gpu": 1.0, "tpu": 8.0}``."""
        out: dict[str, float] = {}
        if self.cpu:
            out["cpu"] = float(self.cpu)
        if self.memory:
            out["memory"] = float(self.memory)
        if self.gpu:
            out["gpu"] = float(self.gpu)
        for kind, amount in self.extra:
            if amount:
                out[kind] = float(amount)
        return out

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON data: ``{"cpu": 4, "memory": 17179869184, "gpu": 1, "tpu": 8}``."""
        out: dict[str, Any] = {}
        for kind, amount in self.amounts().items():
            out[kind] = int(amount) if float(amount).is_integer() else amount
        return out

    def describe(self) -> str:
        """``cpu=4 memory=16GiB gpu=1``; ``none`` when empty."""
        parts = [f"{k}={format_amount(k, v)}" for k, v in self.amounts().items()]
        return " ".join(parts) or "none"

    def __bool__(self) -> bool:
        return bool(self.amounts())


NO_RESOURCES = Resources()
"""The shared empty value (the default of every step)."""


def parse_resources(value: Any, step: str | None = None) -> Resources:
    """A ``Resources`` from ``None``, a ``Resources`` or a mapping; errors name step and field."""
    if value is None:
        return NO_RESOURCES
    if isinstance(value, Resources):
        return value
    if not isinstance(value, Mapping):
        raise _error(
            f"resources={value!r} is a {type(value).__name__}",
            'pass a dict such as {"cpu": 4, "memory": "16GiB", "gpu": 1} or a Resources value',
            step,
        )
    cpu = 0.0
    memory = 0
    gpu = 0
    extra: dict[str, float] = {}
    for key, raw in value.items():
        if not isinstance(key, str) or not _KIND.match(key):
            lower = key.strip().lower() if isinstance(key, str) else ""
            hint = did_you_mean(lower, STANDARD_KINDS, n=1, cutoff=_TYPO) if lower else ""
            raise _error(
                f"resources has the key {key!r}",
                (f"{hint} " if hint else "")
                + "name resource kinds with lowercase letters, digits, '_', '.' or '-' "
                '(e.g. "cpu", "gpu", "tpu")',
                step,
            )
        field_name = f"resources.{key}"
        _check_kind(key, "resources", step)
        if key == "memory":
            memory = parse_memory(raw, step, field_name)
            continue
        number = _number(raw)
        if number is None or number < 0:
            raise _error(f"{field_name}={_shown(raw)} is not an amount", "use a number >= 0", step)
        if number > MAX_AMOUNT:
            raise _too_large(field_name, raw, f"{MAX_AMOUNT:.0e}", step)
        if key == "gpu":
            if not number.is_integer():
                raise _error(
                    f"{field_name}={raw!r} is not a whole number of devices",
                    "ask for a whole number of GPUs (devices are assigned, not shared)",
                    step,
                )
            gpu = int(number)
        elif key == "cpu":
            cpu = number
        else:
            extra[key] = number
    return Resources(cpu=cpu, memory=memory, gpu=gpu, extra=tuple(sorted(extra.items())))


def parse_capacity(text: str) -> Resources:
    """``"cpu=16,memory=64GiB,gpu=2"`` (the ``marin run --resources`` syntax) -> ``Resources``."""
    amounts: dict[str, Any] = {}
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        key, sep, raw = part.partition("=")
        key, raw = key.strip(), raw.strip()
        if not sep or not key or not raw:
            raise _error(
                f"--resources {text!r}: {part!r} is not KIND=AMOUNT",
                "write the capacity as cpu=16,memory=64GiB,gpu=2",
                None,
            )
        if key in amounts:
            raise _error(f"--resources {text!r} names {key!r} twice", "give each kind once", None)
        _check_kind(key, f"--resources {text!r}", None)
        if key == "memory":
            amounts[key] = raw
            continue
        try:
            amounts[key] = float(raw)  # "1e400" is inf: refused as more than the maximum
        except ValueError:
            raise _error(
                f"--resources {text!r}: {key}={raw!r} is not a number",
                "write the capacity as cpu=16,memory=64GiB,gpu=2",
                None,
            ) from None
    return parse_resources(amounts)


def _physical_memory() -> int:
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return 0


def visible_gpus(environ: Mapping[str, str] | None = None) -> list[str]:
    """The GPU device names this process may use: ``CUDA_VISIBLE_DEVICES``, else ``nvidia-smi -L``.

    An empty list means no GPU. The names are what a child's ``CUDA_VISIBLE_DEVICES`` must say.
    """
    env = os.environ if environ is None else environ
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        names = [name.strip() for name in visible.split(",") if name.strip()]
        # CUDA stops at the first invalid entry, conventionally "-1": no devices after it.
        cut = next((i for i, name in enumerate(names) if name.startswith("-")), len(names))
        return names[:cut]
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return []
    try:
        listing = subprocess.run(
            [smi, "-L"], capture_output=True, text=True, timeout=10, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return []
    if listing.returncode != 0:
        return []
    count = sum(1 for line in listing.stdout.splitlines() if line.startswith("GPU "))
    return [str(i) for i in range(count)]


def machine_capacity() -> Resources:
    """This machine: every CPU, the physical memory, and the visible GPUs (0 if none)."""
    return Resources(
        cpu=float(os.cpu_count() or 1),
        memory=_physical_memory(),
        gpu=len(visible_gpus()),
    )


def capacity_from(value: Any = None) -> Resources:
    """A runner's capacity from what a user passes: ``None`` (this machine), a ``Resources``
    (taken as complete), a dict, or the ``marin run --resources`` text ``"cpu=16,gpu=2"``.

    In a dict or text, the standard kinds left out default to this machine's (``gpu=2`` alone
    keeps every CPU and all the memory), so naming one kind never makes the others zero.
    """
    if value is None:
        return machine_capacity()
    if isinstance(value, Resources):
        return value
    if isinstance(value, str):
        given = parse_capacity(value)
        named = {part.partition("=")[0].strip() for part in value.split(",")}
    else:
        given = parse_resources(value)
        named = set(value)
    machine = machine_capacity()
    return Resources(
        cpu=given.cpu if "cpu" in named else machine.cpu,
        memory=given.memory if "memory" in named else machine.memory,
        gpu=given.gpu if "gpu" in named else machine.gpu,
        extra=given.extra,
    )


@dataclass(frozen=True)
class Grant:
    """Resources held by one step, and the GPU devices assigned to it (indices into the pool's)."""

    step_id: str
    request: Resources
    devices: tuple[int, ...] = ()


class ResourcePool:
    """A machine's capacity, shared by the steps of one run. Thread-safe; never blocks.

    GPUs are devices ``0 .. gpu-1`` as this process numbers them (positions in its
    ``CUDA_VISIBLE_DEVICES``, see ``visible_gpus``); a grant carries the lowest free indices, and
    no index is held by two grants at once.
    """

    def __init__(self, capacity: Resources) -> None:
        self.capacity = capacity
        self._capacity = capacity.amounts()
        self._used: dict[str, float] = {}
        self._peak: dict[str, float] = {}
        self._free_devices: list[int] = list(range(capacity.gpu))
        self._held: dict[str, Grant] = {}
        self._reserved: tuple[str, Resources] | None = None
        self._lock = threading.Lock()

    # -- questions --------------------------------------------------------------------------

    def fits_ever(self, request: Resources, step_id: str | None = None) -> str | None:
        """``None`` if ``request`` fits an empty pool, else a message naming what is missing."""
        problem = self.shortfall(request)
        return None if problem is None else format_error(problem[0], problem[1], step_id)

    def shortfall(self, request: Resources) -> tuple[str, str] | None:
        """``(what, fix)`` when ``request`` can never fit this pool, else ``None``."""
        wanted = request.amounts()
        missing = [k for k, amount in wanted.items() if amount > self._capacity.get(k, 0.0) + _EPS]
        if not missing:
            return None
        short = ", ".join(
            f"{kind}={format_amount(kind, wanted[kind])} but the machine has "
            f"{format_amount(kind, self._capacity.get(kind, 0.0))}"
            for kind in missing
        )
        custom = [kind for kind in missing if kind not in STANDARD_KINDS]
        if custom:  # said to be custom: a machine has none of it until its capacity says so
            short += f" ({', '.join(custom)}: a custom kind, which only --resources provides)"
        return (
            f"the step asks for {short}",
            "lower its resources, or declare the machine's capacity with "
            f"marin run --resources {_capacity_example(self.capacity, request)} "
            "(StepRunner(resources=...))",
        )

    @property
    def reserved_for(self) -> str | None:
        """The step id the pool is holding free resources for, if any."""
        with self._lock:
            return self._reserved[0] if self._reserved else None

    def in_use(self) -> dict[str, float]:
        with self._lock:
            return {k: v for k, v in self._used.items() if v > _EPS}

    def peak(self) -> dict[str, float]:
        """The most of each kind held at once since the pool was made (for tests and reports)."""
        with self._lock:
            return dict(self._peak)

    def holders(self) -> dict[str, Grant]:
        with self._lock:
            return dict(self._held)

    # -- acquire / release ------------------------------------------------------------------

    def try_acquire(
        self, step_id: str, request: Resources, *, reserve: bool = True
    ) -> Grant | None:
        """A grant if ``request`` fits now (respecting the reservation), else ``None``.

        The first step refused while no reservation exists becomes the reservation (unless
        ``reserve=False``). Offer steps in priority order so the reservation goes to the most
        urgent one. Raises ``ValueError`` for a request that can never fit (check ``fits_ever``
        at plan time).
        """
        wanted = request.amounts()
        message = self.fits_ever(request, step_id) if wanted else None  # nothing never misfits
        if message is not None:
            raise ValueError(message)
        with self._lock:
            if step_id in self._held:
                raise ValueError(f"error: step {step_id} already holds resources")
            reservation = self._reserved
            holdback: dict[str, float] = {}
            if reservation is not None and reservation[0] != step_id:
                holdback = reservation[1].amounts()
            for kind, amount in wanted.items():
                free = self._capacity.get(kind, 0.0) - self._used.get(kind, 0.0)
                # What is free beyond the reservation's needs is all others may take.
                if amount > free - holdback.get(kind, 0.0) + _EPS:
                    if reserve and reservation is None:
                        self._reserved = (step_id, request)
                    return None
            devices = tuple(self._free_devices[: request.gpu])
            del self._free_devices[: request.gpu]
            for kind, amount in wanted.items():
                used = self._used.get(kind, 0.0) + amount
                self._used[kind] = used
                self._peak[kind] = max(self._peak.get(kind, 0.0), used)
            if reservation is not None and reservation[0] == step_id:
                self._reserved = None
            grant = Grant(step_id, request, devices)
            self._held[step_id] = grant
            return grant

    def release(self, grant: Grant) -> None:
        """Give a grant's resources and devices back. Releasing twice is an error."""
        with self._lock:
            if self._held.get(grant.step_id) is not grant:
                raise ValueError(f"error: step {grant.step_id} holds no such grant")
            del self._held[grant.step_id]
            for kind, amount in grant.request.amounts().items():
                left = self._used.get(kind, 0.0) - amount
                self._used[kind] = 0.0 if left < _EPS else left
            if grant.devices:
                self._free_devices = sorted(self._free_devices + list(grant.devices))

    def withdraw(self, step_id: str) -> None:
        """Drop ``step_id``'s reservation (it will not start: cancelled, failed upstream...)."""
        with self._lock:
            if self._reserved is not None and self._reserved[0] == step_id:
                self._reserved = None


def _capacity_example(capacity: Resources, request: Resources) -> str:
    merged = dict(capacity.amounts())
    for kind, amount in request.amounts().items():
        merged[kind] = max(merged.get(kind, 0.0), amount)
    return ",".join(f"{k}={format_amount(k, v)}" for k, v in merged.items())


def check_fits(pool: ResourcePool, steps: Iterable[Any]) -> None:
    """Plan-time check: raise for the first step whose resources can never fit ``pool``."""
    for spec in steps:
        request = getattr(spec, "resources", None)
        if isinstance(request, Resources):
            problem = pool.shortfall(request)
            if problem is not None:
                raise InvalidStepError(problem[0], problem[1], spec.step_id)


def placement_of(spec: Any) -> dict[str, Any]:
    """A step's placement options as plain data (for ``marin plan --json``)."""
    resources = getattr(spec, "resources", NO_RESOURCES)
    return {
        "resources": resources.to_dict() if isinstance(resources, Resources) else {},
        "timeout_s": getattr(spec, "timeout", None),
        "queue": getattr(spec, "queue", None),
        "isolate": bool(getattr(spec, "isolate", False)),
        # Only when set: plans of pipelines without remote steps are unchanged.
        **({"remote": remote} if (remote := getattr(spec, "remote", None)) else {}),
    }


def describe_placement(spec: Any) -> str:
    """``gpu=2 memory=16GiB, timeout 2h, queue gpu, isolated``; ``""`` for a step with none."""
    parts: list[str] = []
    resources = getattr(spec, "resources", NO_RESOURCES)
    if isinstance(resources, Resources) and resources:
        custom = custom_kinds(resources)
        # Said to be custom: a typo'd kind is refused, but a real one needs --resources too.
        parts.append(resources.describe() + (f" ({', '.join(custom)}: custom)" if custom else ""))
    timeout = getattr(spec, "timeout", None)
    if timeout is not None:
        parts.append(f"timeout {format_duration(timeout)}")
    queue = getattr(spec, "queue", None)
    if queue is not None:
        parts.append(f"queue {queue}")
    if getattr(spec, "isolate", False):
        parts.append("isolated")
    remote = getattr(spec, "remote", None)
    if remote is not None:
        parts.append(f"remote {remote}")
    return ", ".join(parts)


def format_duration(seconds: float) -> str:
    """``7200`` -> ``2h``, ``5400`` -> ``1h30m``, ``90.5`` -> ``90.5s``."""
    if not float(seconds).is_integer():
        return f"{seconds:g}s"
    left = int(seconds)
    parts = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if left >= size:
            parts.append(f"{left // size}{unit}")
            left %= size
    return "".join(parts) or "0s"
