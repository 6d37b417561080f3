"""The conclusion on an incident's culprit GPUs from their compared telemetry
(:func:`analyzer.score.gpu_signals.compare`): the ``hardware`` record of the incident. Pure.

- ``hardware_fault``: a signal sets a culprit GPU apart from its own baseline and its peers;
- ``no_hardware_signal``: data for the culprit GPUs and nothing that sets them apart (look at
  software, data, the host);
- ``no_data``: no usable series for those GPUs;
- ``unavailable``: the source did not answer (made by the caller, :func:`unavailable`).

Each comes with ``source``, per culprit GPU its signals and medians, and a one-line
``summary``; :data:`PHRASES` names the fault in the incident's title ("GPU thermal throttling").
"""

from __future__ import annotations

import numpy as np

from analyzer.score.gpu_signals import AFTER, BEFORE, Comparison, SignalRules
from rankscope import gpu_health as gh

#: The words of a fault in a title, the most telling first.
PHRASES: list[tuple[str, str]] = [
    (gh.XID, "GPU {xid}"), (gh.ECC_DBE, "GPU memory errors"), (gh.REMAPPED_ROWS, "GPU memory errors"),
    (gh.ROW_REMAP_FAILURE, "GPU row-remap failure"), ("hw_thermal_slowdown", "GPU thermal throttling"),
    ("sw_thermal_slowdown", "GPU thermal throttling"), (gh.TEMPERATURE, "GPU thermal throttling"),
    ("hw_power_brake", "GPU power brake"), ("hw_slowdown", "GPU hardware slowdown"),
    ("sw_power_cap", "GPU power capping"), (gh.POWER, "GPU power capping"), (gh.SM_CLOCK, "GPU clocks low"),
    (gh.PCIE_REPLAYS, "PCIe replays"), (gh.NVLINK_BANDWIDTH, "NVLink traffic down"),
]
LEVEL_WORDS = {name: (label, f" {unit}") for name, (label, unit) in gh.LEVEL_NAMES.items()}


def _r(x: object, nd: int = 3) -> float | None:
    return None if x is None or not np.isfinite(float(x)) else round(float(x), nd)


def _signal_entry(row: dict) -> dict:
    if row["kind"] == "event":
        return {"signal": row["signal"], "share_before": _r(row[BEFORE]), "share_after": _r(row[AFTER]),
                "share_peers": _r(row["peers"])}
    if row["kind"] == "error":
        out = {"signal": row["signal"], "samples_after": int(row[AFTER]), "samples_before": int(row[BEFORE]),
               "share_peers": _r(row["peers"])}
        if row["codes"]:
            out["xids"] = [{"code": int(c), "meaning": gh.xid_meaning(c)} for c in row["codes"]]
        return out
    return {"signal": row["signal"], "before": _r(row[BEFORE], 2), "after": _r(row[AFTER], 2),
            "peers": _r(row["peers"], 2)}


def gpu_entries(found: Comparison, gpus: list[dict]) -> list[dict]:
    """Per culprit GPU found in the samples: host, gpu, uuid, ranks, sample counts, the medians of
    clock, temperature and power, its signals (``fault`` ones) and its context reasons."""
    by_key: dict[str, list[dict]] = {}
    for r in found.rows():
        by_key.setdefault(r["key"], []).append(r)
    out = []
    for g in sorted(found.gpu_rows(), key=lambda g: (str(g["host"]), int(g["gpu"]))):
        host, gpu, uuid = str(g["host"]), int(g["gpu"]), str(g["uuid"])
        rows = by_key.get(g["key"], [])
        levels = {r["signal"]: {"before": _r(r[BEFORE], 1), "after": _r(r[AFTER], 1), "peers": _r(r["peers"], 1)}
                  for r in rows if r["kind"] == "level" and r["signal"] in LEVEL_WORDS}
        ranks = [x["rank"] for x in gpus if x.get("host") == host and x.get("gpu") in (gpu, None)
                 or (uuid and x.get("uuid") == uuid)]
        out.append({"host": host, "gpu": gpu if gpu >= 0 else None, "uuid": uuid or None, "ranks": sorted(set(ranks)),
                    "samples": {BEFORE: int(g[BEFORE]), AFTER: int(g[AFTER])},
                    **levels, "signals": [_signal_entry(r) for r in rows if r["fault"]],
                    "context": sorted({r["signal"] for r in rows if r["context"]})})
    return out


def phrase(entries: list[dict]) -> str:
    """The title's words for the faults found ("" for none)."""
    found = {s["signal"]: s for e in entries for s in e["signals"]}
    for signal, words in PHRASES:
        if signal in found:
            xids = found[signal].get("xids") or [{"code": 0}]
            return words.format(xid=gh.xid_text(xids[0]["code"]) if signal == gh.XID else "")
    return ""


def _pct(x: float | None) -> str:
    return "?" if x is None else f"{100 * x:.0f}%"


def _num(x: float | None) -> str:
    return "?" if x is None else f"{x:.0f}"


def _signal_words(name: str, found: list[dict], peers: int) -> str:
    """One signal over the culprit GPUs that show it, in words."""
    med = lambda k: _r(np.nanmedian([np.nan if s.get(k) is None else s[k] for s in found]))  # noqa: E731
    if "share_after" in found[0]:
        return (f"{name} in {_pct(med('share_after'))} of samples after the onset ({_pct(med('share_before'))} "
                f"before, {_pct(med('share_peers'))} on {peers} peer GPUs)")
    if "samples_after" in found[0]:
        codes = sorted({x["code"] for s in found for x in s.get("xids", [])})
        what = ", ".join(gh.xid_text(c) for c in codes) if codes else name.replace("_", " ")
        return f"{what} after the onset (on {_pct(med('share_peers'))} of {peers} peer GPUs)"
    label, unit = LEVEL_WORDS.get(name, (name.replace("_", " "), ""))
    return f"{label} {_num(med('after'))}{unit} ({_num(med('before'))} before, {_num(med('peers'))} on the peers)"


def _levels_words(entries: list[dict]) -> str:
    parts = []
    for name, (label, unit) in LEVEL_WORDS.items():
        vals = [e[name]["after"] for e in entries if name in e and e[name]["after"] is not None]
        if vals:
            peers = [e[name]["peers"] for e in entries if name in e and e[name]["peers"] is not None]
            parts.append(f"{label} {np.median(vals):.0f}{unit}" + (f" (peers {np.median(peers):.0f})" if peers else ""))
    return ", ".join(parts)


def _where(entries: list[dict]) -> str:
    by_host: dict[str, list[int]] = {}
    for e in entries:
        by_host.setdefault(e["host"], []).append(e["gpu"] if e["gpu"] is not None else -1)
    parts = []
    for host, gpus in by_host.items():
        known = sorted(g for g in gpus if g >= 0)
        span = f"{known[0]}-{known[-1]}" if len(known) > 1 and known == list(range(known[0], known[-1] + 1)) \
            else ",".join(map(str, known))
        parts.append(f"{host} GPU{'s' if len(gpus) > 1 else ''} {span}" if known else host)
    return "; ".join(parts[:4]) + (f" and {len(parts) - 4} more hosts" if len(parts) > 4 else "")


def hardware_record(found: Comparison, gpus: list[dict], source: str, rules: SignalRules, note: str = "") -> dict:
    """The ``hardware`` record of an incident from one source's compared samples."""
    entries = gpu_entries(found, gpus)
    peers = found.peer_gpus
    have = [e for e in entries if e["samples"][AFTER] >= rules.min_samples]
    base = {"source": source, "gpus": entries, "peer_gpus": peers}
    if not have:
        hosts = ", ".join(sorted({g["host"] for g in gpus})[:4])
        return {"verdict": "no_data", **base, "phrase": "",
                "summary": f"{source}: no series for the culprit GPUs ({hosts}) after the onset"
                           + (f" ({note})" if note else "") + "."}
    faulty = [e for e in have if e["signals"]]
    context = sorted({c for e in have for c in e["context"]})
    ctx = f"; {', '.join(context)} {'is' if len(context) == 1 else 'are'} on the peers or before too: context" \
        if context else ""
    alone = "" if peers else "; no peer GPUs to compare with"
    if not faulty:
        return {"verdict": "no_hardware_signal", **base, "phrase": "",
                "summary": f"{source}: {_where(have)}: nothing sets them apart from their own baseline and "
                           f"{peers} peer GPUs ({_levels_words(have)}){ctx}{alone}: look at software, data, the host."}
    names: dict[str, list[dict]] = {}
    for e in faulty:
        for s in e["signals"]:
            names.setdefault(s["signal"], []).append(s)
    order = [n for n, _ in PHRASES if n in names] + [n for n in names if n not in dict(PHRASES)]
    words = "; ".join(_signal_words(n, names[n], peers) for n in order[:4])
    return {"verdict": "hardware_fault", **base, "phrase": phrase(faulty),
            "summary": f"{source}: {_where(faulty)}: {words}{ctx}{alone}."}


def unavailable(source: str, reason: str) -> dict:
    """The record of a source that did not answer (tried again next cycle)."""
    return {"verdict": "unavailable", "source": source, "gpus": [], "phrase": "",
            "summary": f"{source} unavailable: {reason}; tried again next cycle."}
