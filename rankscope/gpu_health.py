"""The facts of a GPU's own telemetry every part shares: the ``gpu_health`` fields, the clock-event
bits of DCGM field 112 / NVML's clocks event reasons, the XID codes' meanings, and which of the
job's nodes a culprit's GPUs are compared with.

The collector's NVML sampler and the simulator write ``gpu_health`` with these field names; the
analyzer reads them, and the same quantities from DCGM's exporter (Prometheus) and Telegraf's
``nvidia_smi`` (InfluxDB), under one set of names (:data:`SIGNALS`).

Example::

    >>> decode_reasons(0x48)
    ['hw_slowdown', 'hw_thermal_slowdown']
    >>> xid_meaning(79)
    'GPU has fallen off the bus'
    >>> peer_nodes([5], nodes=12, count=4)
    [6, 4, 0, 11]
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from rankscope.schema import GPU_UUID_FIELD

#: Field 112 (DCGM_FI_DEV_CLOCKS_EVENT_REASONS, once DCGM_FI_DEV_CLOCK_THROTTLE_REASONS) and NVML's
#: ``nvmlDeviceGetCurrentClocksEventReasons``: one bit per reason the clocks are held below the maximum.
CLOCK_EVENT_BITS: dict[str, int] = {
    "gpu_idle": 0x1,
    "applications_clocks_setting": 0x2,
    "sw_power_cap": 0x4,
    "hw_slowdown": 0x8,
    "sync_boost": 0x10,
    "sw_thermal_slowdown": 0x20,
    "hw_thermal_slowdown": 0x40,
    "hw_power_brake": 0x80,
}
#: Reasons that say the GPU is idle or set so, never that it is faulty: always context.
BENIGN_REASONS = frozenset({"gpu_idle", "applications_clocks_setting", "sync_boost"})
#: dcgm-exporter's ``clock_event`` label values of ``DCGM_EXP_CLOCK_EVENTS_COUNT`` -> the names above.
EXPORTER_CLOCK_EVENTS: dict[str, str] = {
    "gpu_idle": "gpu_idle", "clocks_setting": "applications_clocks_setting", "power_cap": "sw_power_cap",
    "hw_slowdown": "hw_slowdown", "sync_boost": "sync_boost", "sw_thermal": "sw_thermal_slowdown",
    "hw_thermal": "hw_thermal_slowdown", "hw_power_brake": "hw_power_brake",
}

#: What the common XID codes mean (NVIDIA's XID catalogue, shortened).
XID_MEANINGS: dict[int, str] = {
    13: "graphics engine exception (an illegal instruction or address: often the application)",
    31: "GPU memory page fault (often the application; repeated: the GPU)",
    43: "GPU stopped processing (a reset channel)",
    45: "preemptive cleanup after an earlier error (the process was killed)",
    48: "double-bit ECC error (uncorrectable memory error)",
    63: "ECC page retirement or row remapping recorded",
    64: "ECC page retirement or row remapping failure",
    74: "NVLink error",
    79: "GPU has fallen off the bus",
    92: "high single-bit ECC error rate",
    94: "contained ECC error (an uncorrectable error the GPU contained)",
    95: "uncontained ECC error (reset the GPU)",
}

#: The names every source's samples are read into (a long frame's ``signal`` column).
REASONS = "clock_event_reasons"
SM_CLOCK = "sm_clock_mhz"
TEMPERATURE = "temperature_c"
POWER = "power_w"
XID = "xid"
PCIE_REPLAYS = "pcie_replays"
NVLINK_BANDWIDTH = "nvlink_bandwidth"
ROW_REMAP_FAILURE = "row_remap_failure"
REMAPPED_ROWS = "uncorrectable_remapped_rows"
ECC_DBE = "ecc_dbe_volatile"
UTILIZATION = "utilization_gpu"
#: Levels (a median is compared), events (a share of the samples), counters (a rate, resets handled).
LEVELS = (SM_CLOCK, TEMPERATURE, POWER, UTILIZATION)
COUNTERS = (PCIE_REPLAYS, NVLINK_BANDWIDTH, REMAPPED_ROWS, ECC_DBE)
SIGNALS = (REASONS, XID, ROW_REMAP_FAILURE, *LEVELS, *COUNTERS)
#: The levels every culprit GPU's hardware record holds, as people read them: signal -> (label, unit).
LEVEL_NAMES: dict[str, tuple[str, str]] = {SM_CLOCK: ("SM clock", "MHz"), TEMPERATURE: ("temperature", "°C"),
                                           POWER: ("power", "W")}
#: ``gpu_health`` fields besides the signals: the GPU's UUID (a string, not a tag).
UUID_FIELD = GPU_UUID_FIELD
#: DCGM writes these for "no value" (its blank sentinels sit just below 2**63; 2**31 for 32-bit fields).
DCGM_BLANK_MIN = float(0x7FFFFFF0)


def decode_reasons(mask: int) -> list[str]:
    """The names of the reasons set in one field-112 bitmask, in bit order."""
    return [name for name, bit in CLOCK_EVENT_BITS.items() if int(mask) & bit]


def reason_bits(masks: np.ndarray) -> dict[str, np.ndarray]:
    """Every reason's bit over an array of bitmasks (NaN: no sample, False everywhere)."""
    m = np.asarray(masks, dtype=float)
    ints = np.where(np.isfinite(m) & (m >= 0), m, 0).astype(np.int64)
    return {name: (ints & bit) != 0 for name, bit in CLOCK_EVENT_BITS.items()}


def xid_meaning(code: int) -> str:
    """The meaning of an XID code ("" for a code not in :data:`XID_MEANINGS`)."""
    return XID_MEANINGS.get(int(code), "")


def xid_text(code: int) -> str:
    """``XID 79 (GPU has fallen off the bus)``."""
    meaning = xid_meaning(code)
    return f"XID {int(code)}" + (f" ({meaning})" if meaning else "")


def peer_nodes(culprits: Iterable[int], nodes: int, count: int = 12) -> list[int]:
    """The job's nodes a culprit's GPUs are compared with: half the nearest by node id (in
    Megatron's order the same pipeline stage: the same work), alternately after and before,
    half evenly spread over the job (a condition of a whole rack or of the whole job shows as
    one); never a culprit, at most ``count``, in that order."""
    bad = sorted({int(n) for n in culprits if 0 <= int(n) < nodes})
    if not bad or nodes <= len(bad):
        return []
    taken: set[int] = set(bad)
    out: list[int] = []
    near, spread = (count + 1) // 2, count // 2

    def take(n: int) -> None:
        if 0 <= n < nodes and n not in taken and len(out) < count:
            taken.add(n)
            out.append(n)

    for d in range(1, nodes):
        if len(out) >= near:
            break
        take(bad[-1] + d)
        take(bad[0] - d)
    for n in np.linspace(0, nodes - 1, max(spread, 1) + 1 if spread else 0).round().astype(int):
        take(int(n))
    for d in range(1, nodes):   # a small job: fill up with whatever is left
        if len(out) >= count:
            break
        take(bad[-1] + d)
        take(bad[0] - d)
    return out
