"""What Grafana does to an InfluxQL query before sending it, so tests can run the
generated queries against a real InfluxDB exactly as Grafana would.

- ``$timeFilter`` -> ``time >= <from>ms and time <= <to>ms`` (a panel's relative time
  override ``timeFrom`` makes its range now-``timeFrom`` to now when the dashboard's range is
  relative, and is ignored when it is absolute, as Grafana does);
- ``$__interval`` / ``$interval`` -> the panel's interval (time range / maxDataPoints,
  rounded like Grafana's ``roundInterval``, at least the panel's or data source's
  minimum interval), ``$__interval_ms`` -> the same in ms;
- template variables ``$name``, ``${name}``, ``[[name]]`` -> their values, formatted
  like Grafana's InfluxDB data source: numbers raw; multi-value / include-all
  variables regex-escaped and joined as ``(a|b)``; a single value inside a
  ``=~ /.../`` regex escaped;
- variable queries parsed like its response parser (SHOW FIELD KEYS: first column;
  SHOW TAG VALUES and SELECT: second column), filtered/captured by the variable's
  regex, sorted by its sort order; ``All`` = every option.
"""

from __future__ import annotations

import json
import re
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass

# (upper bound of the raw interval in ms, rounded interval in ms), Grafana's roundInterval.
_ROUNDING = [
    (15, 10), (35, 20), (75, 50), (150, 100), (350, 200), (750, 500), (1500, 1000),
    (3500, 2000), (7500, 5000), (12500, 10000), (17500, 15000), (25000, 20000), (45000, 30000),
    (90000, 60000), (210000, 120000), (450000, 300000), (750000, 600000), (1050000, 900000),
    (1500000, 1200000), (2700000, 1800000), (5400000, 3600000), (9000000, 7200000),
    (16200000, 10800000), (32400000, 21600000), (86400000, 43200000), (604800000, 86400000),
    (1814400000, 604800000), (3628800000, 2592000000),
]
_UNITS_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000, "w": 604_800_000}
_VARIABLE = re.compile(r"\$(\w+)|\[\[(\w+?)(?::(\w+))?\]\]|\$\{(\w+)(?::([^}]+))?\}")
_REGEX_SPAN = re.compile(r"=~\s*/((?:\\.|[^/\\])*)/")
BUILTINS = frozenset({"timeFilter", "__interval", "interval", "__interval_ms", "__from", "__to"})


@dataclass(frozen=True)
class TimeRange:
    """A dashboard's range. ``relative``: picked as ``now-6h`` to ``now`` (a wall), with now
    at ``end_ms``; else absolute (a zoom, a drag-select, a link with from/to)."""

    start_ms: int
    end_ms: int
    relative: bool = False


def parse_duration_ms(text: str) -> int:
    m = re.fullmatch(r"(\d+)(ms|s|m|h|d|w)", text.strip())
    if not m:
        raise ValueError(f"not a Grafana duration: {text!r}")
    return int(m.group(1)) * _UNITS_MS[m.group(2)]


def round_interval(ms: float) -> int:
    for bound, rounded in _ROUNDING:
        if ms < bound:
            return rounded
    return 31536000000


def format_interval(ms: int) -> str:
    for unit in ("w", "d", "h", "m", "s"):
        size = _UNITS_MS[unit]
        if ms >= size and ms % size == 0:
            return f"{ms // size}{unit}"
    return f"{ms}ms"


def panel_interval_ms(time_range: TimeRange, max_data_points: int | None,
                      min_interval: str | None = None) -> int:
    """Grafana's ``$__interval`` for a panel (in ms)."""
    points = max_data_points or 1000
    ms = round_interval((time_range.end_ms - time_range.start_ms) / points)
    if min_interval:
        ms = max(ms, parse_duration_ms(min_interval))
    return ms


@dataclass(frozen=True)
class Variable:
    name: str
    value: str | list[str]
    multi: bool = False
    include_all: bool = False


def escape_regex(value: str) -> str:
    return re.sub(r"([\\^$*+?.()|\[\]{}/])", r"\\\1", value)


def _is_number(value: object) -> bool:
    return isinstance(value, str) and re.match(r"\s*[+-]?(\d+\.?\d*|\.\d+)", value) is not None


def format_value(var: Variable, in_regex: bool) -> str:
    if _is_number(var.value):
        return var.value  # type: ignore[return-value]
    if var.multi or var.include_all:
        values = var.value if isinstance(var.value, list) else [var.value]
        escaped = [escape_regex(v) for v in values]
        return escaped[0] if len(escaped) == 1 else "(" + "|".join(escaped) + ")"
    value = var.value if isinstance(var.value, str) else ",".join(var.value)
    return escape_regex(value) if in_regex else value


def interpolate(query: str, variables: dict[str, Variable], time_range: TimeRange, interval_ms: int) -> str:
    """``query`` as Grafana sends it to InfluxDB; raises on an unknown variable."""
    spans = [m.span(1) for m in _REGEX_SPAN.finditer(query)]

    def replace(m: re.Match) -> str:
        name = m.group(1) or m.group(2) or m.group(4)
        if name in BUILTINS:
            return m.group(0)
        if name not in variables:
            raise KeyError(f"query uses ${name}, which no template variable defines: {query}")
        in_regex = any(a <= m.start() < b for a, b in spans)
        return format_value(variables[name], in_regex)

    out = _VARIABLE.sub(replace, query)
    interval = format_interval(interval_ms)
    out = out.replace("$timeFilter", f"time >= {time_range.start_ms}ms and time <= {time_range.end_ms}ms")
    out = out.replace("$__interval_ms", str(interval_ms))
    out = out.replace("$__interval", interval).replace("$interval", interval)
    for name, ms in (("__from", time_range.start_ms), ("__to", time_range.end_ms)):
        out = out.replace("${" + name + "}", str(ms)).replace("$" + name, str(ms))
    if re.search(r"\$\w|\$\{|\[\[", _strip_strings(out)):
        raise ValueError(f"unsubstituted macro left in {out}")
    return out


def _strip_strings(q: str) -> str:
    return re.sub(r"'(?:\\.|[^'\\])*'", "''", q)


_CONSTANT_COMPARISON = re.compile(r"(?<![\w.])(\d+) (<|>=) (\d+)(?![\w.])")


def answers(query: str) -> bool:
    """False when a filled query holds a comparison of two numbers that is false (a panel target
    that answers other column widths: ``$__interval_ms < 3600000`` with an hour filled in), so
    InfluxDB returns nothing by design; True otherwise."""
    ops = {"<": lambda a, b: a < b, ">=": lambda a, b: a >= b}
    return all(ops[op](int(a), int(b)) for a, op, b in _CONSTANT_COMPARISON.findall(_strip_strings(query)))


# -------------------------------------------------------------- running queries
@dataclass
class QueryResult:
    query: str
    series: list[dict]

    @property
    def rows(self) -> int:
        return sum(len(s.get("values", [])) for s in self.series)


def influx_query(url: str, db: str, q: str) -> QueryResult:
    """Run one InfluxQL statement over HTTP; raise AssertionError on an error answer."""
    params = urllib.parse.urlencode({"db": db, "q": q, "epoch": "ms"})
    with urllib.request.urlopen(f"{url}/query?{params}", timeout=60) as resp:
        data = json.loads(resp.read())
    if "error" in data:
        raise AssertionError(f"InfluxDB error {data['error']!r} for: {q}")
    series: list[dict] = []
    for res in data.get("results", []):
        if "error" in res:
            raise AssertionError(f"InfluxDB error {res['error']!r} for: {q}")
        series.extend(res.get("series", []))
    return QueryResult(q, series)


def metric_find_values(query: str, result: QueryResult) -> list[str]:
    """Option values of a query variable, parsed like Grafana's InfluxDB response parser."""
    value_first = any(k in query.lower() for k in ("show field keys", "show retention policies"))
    out: list[str] = []
    for s in result.series:
        for row in s.get("values", []):
            if value_first or len(row) < 2:
                v = row[0]
            else:
                v = row[1]
            if v is not None and str(v) not in out:
                out.append(str(v))
    return out


def _js_regex(text: str) -> re.Pattern:
    m = re.fullmatch(r"/(.*)/([gimsuy]*)", text, flags=re.S)
    if not m:
        return re.compile(text)
    flags = re.I if "i" in m.group(2) else 0
    return re.compile(m.group(1), flags)


def apply_variable_regex(values: list[str], regex: str | None) -> list[str]:
    """Grafana's variable regex: keep matching options, use the first capture group when there is one."""
    if not regex:
        return values
    pattern = _js_regex(regex)
    out = []
    for v in values:
        m = pattern.search(v)
        if not m:
            continue
        text = m.group(1) if m.groups() and m.group(1) is not None else v
        if text not in out:
            out.append(text)
    return out


def _sort(values: list[str], order: int) -> list[str]:
    if order in (1, 2):
        return sorted(values, reverse=order == 2)
    if order in (3, 4):
        def key(v: str) -> float:
            m = re.search(r"-?\d+(\.\d+)?", v)
            return float(m.group(0)) if m else float("-inf")
        return sorted(values, key=key, reverse=order == 4)
    return values


@dataclass(frozen=True)
class PanelQuery:
    """One query of a dashboard as Grafana sends it: where it comes from and its text."""

    where: str
    query: str
    title: str = ""


def dashboard_queries(model: dict, variables: dict[str, Variable], time_range: TimeRange,
                      default_min_interval: str | None = None) -> list[PanelQuery]:
    """Every panel target and annotation query of a dashboard, macros and variables filled as
    Grafana fills them (each panel's ``$__interval`` from its maxDataPoints and minimum interval,
    else the data source's)."""
    out = []
    for panel in model["panels"]:
        tr = time_range
        if panel.get("timeFrom") and time_range.relative:
            # relative time override (Grafana's applyPanelTimeOverrides): now-<timeFrom> to now, and
            # only when the dashboard's range is relative itself; an absolute range is kept
            tr = TimeRange(time_range.end_ms - parse_duration_ms(panel["timeFrom"]), time_range.end_ms, True)
        interval = panel_interval_ms(tr, panel.get("maxDataPoints"), panel.get("interval") or default_min_interval)
        for t in panel.get("targets", []):
            if (t.get("datasource") or {}).get("type") == "prometheus":
                continue   # PromQL: run against a real Prometheus by tests/test_hardware_prometheus.py
            out.append(PanelQuery(f"panel {panel['id']} {panel['title']!r} {t['refId']}",
                                  interpolate(t["query"], variables, tr, interval), panel["title"]))
    for ann in model["annotations"]["list"]:
        out.append(PanelQuery(f"annotation {ann['name']!r}", interpolate(ann["query"], variables, time_range, 1000),
                              f"annotation: {ann['name']}"))
    return out


def resolve_variables(model: dict, run: Callable[[str], QueryResult], time_range: TimeRange,
                      queries: list[tuple[str, str, QueryResult]] | None = None) -> dict[str, Variable]:
    """Every template variable of a dashboard model, resolved in order as Grafana does.

    Query variables run their (interpolated) query through ``run``; the result
    is recorded in ``queries`` as (where, query, result).
    """
    resolved: dict[str, Variable] = {}
    for var in model.get("templating", {}).get("list", []):
        name, kind = var["name"], var.get("type", "query")
        multi, include_all = bool(var.get("multi")), bool(var.get("includeAll"))
        current = (var.get("current") or {}).get("value")
        if kind == "custom":
            options = [o["value"] for o in var.get("options", [])]
        elif kind == "query":
            q = interpolate(var["query"], resolved, time_range, 1000)
            result = run(q)
            if queries is not None:
                queries.append((f"variable {name}", q, result))
            options = _sort(apply_variable_regex(metric_find_values(q, result), var.get("regex")),
                            int(var.get("sort") or 0))
        else:
            raise AssertionError(f"variable {name}: type {kind} not emulated")
        if not options:
            resolved[name] = Variable(name, [] if multi else "", multi, include_all)
            continue
        if current in ("$__all", ["$__all"]) and include_all:
            value: str | list[str] = options
        elif isinstance(current, list) and current and all(c in options for c in current):
            value = current if multi else current[0]
        elif isinstance(current, str) and current in options:
            value = [current] if multi else current
        else:
            value = [options[0]] if multi else options[0]
        resolved[name] = Variable(name, value, multi, include_all)
    return resolved
