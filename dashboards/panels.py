"""Typed building blocks shared by every rankscope dashboard.

All panels, variables and annotations query the one InfluxDB data source that
:mod:`dashboards.provisioning` provisions under the pinned uid
:data:`DATASOURCE_UID`, in raw InfluxQL (``rawQuery: true``) with Grafana's
macros (``$timeFilter``, ``$__interval``) and template variables. Every query
reads a measurement through :func:`source` (:func:`rankscope.store.influxql.source`, the FROM
the store reads too), which names its retention policy.

grafanalib 0.7.1 writes the legacy (pre-9.1) heatmap model, which Grafana only
migrates while ``options`` is empty; :func:`rows_heatmap` writes the current
model through ``extraJson`` instead (rows = series, no bucket calculation).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field

import attr
from grafanalib import core as g
from grafanalib.influxdb import InfluxDBTarget

from rankscope.store.influxql import source

#: uid under which the provisioning creates the InfluxDB data source.
DATASOURCE_UID = "rankscope-influxdb"
DATASOURCE_NAME = "rankscope InfluxDB"
DATASOURCE: dict[str, str] = {"type": "influxdb", "uid": DATASOURCE_UID}
#: The Prometheus holding NVIDIA dcgm-exporter's metrics (the incident drill-down's GPU panels).
PROMETHEUS_UID = "rankscope-prometheus"
PROMETHEUS_NAME = "rankscope Prometheus (DCGM)"
PROMETHEUS: dict[str, str] = {"type": "prometheus", "uid": PROMETHEUS_UID}

#: Most rows a heatmap may ask a browser to draw.
HEATMAP_MAX_ROWS = 2000
#: Most cells (rows x columns) a heatmap over every host and hours asks InfluxDB for: the
#: answer's size, not the points read, is what a wall waits for (influxd 1.6 spends ~5.5 us per
#: returned cell of ``GROUP BY time(), "node"`` on top of ~75 ms for 1,620 series: 13,000 cells
#: ~0.15 s, BENCHMARKS.md). The dashboards are generated for IL-0477's 1,620 nodes: 8 columns
#: (hour-long over 6 h, 20 minutes over 3 h; over up to a day Grafana's rounding can add up to
#: a quarter more), for every job. Recent detail is a panel of its own.
HEATMAP_MAX_CELLS = 13_000
#: The same for a heatmap bounded to the last half hour: one column a minute up to 2,000 rows.
HEATMAP_RECENT_MAX_CELLS = 60_000
#: Grid width of a Grafana dashboard.
GRID_COLUMNS = 24

# Grafana's variable sort orders and refresh modes.
SORT_NUMERIC_ASC = 3
REFRESH_ON_LOAD = 1
REFRESH_ON_TIME_CHANGE = 2


class Layout:
    """Places panels left to right on the 24-column grid, wrapping to a new row.

    A row's height is that of its tallest panel, so panels never overlap.
    """

    def __init__(self) -> None:
        self.x = 0
        self.y = 0
        self.row_h = 0

    def place(self, w: int, h: int) -> g.GridPos:
        if not 1 <= w <= GRID_COLUMNS:
            raise ValueError(f"panel width {w} must be 1..{GRID_COLUMNS}")
        if self.x + w > GRID_COLUMNS:
            self.newline()
        pos = g.GridPos(h=h, w=w, x=self.x, y=self.y)
        self.x += w
        self.row_h = max(self.row_h, h)
        return pos

    def newline(self) -> None:
        self.y += self.row_h
        self.x = 0
        self.row_h = 0


def target(query: str, ref_id: str = "A", alias: str = "", table: bool = False) -> InfluxDBTarget:
    """A raw InfluxQL query on the rankscope data source."""
    return InfluxDBTarget(query=" ".join(query.split()), refId=ref_id, alias=alias,
                          format="table" if table else "time_series", datasource=DATASOURCE)


def prom_target(expr: str, ref_id: str = "A", legend: str = "") -> g.Target:
    """A PromQL query on the Prometheus data source (dcgm-exporter's metrics)."""
    return g.Target(expr=expr, refId=ref_id, legendFormat=legend, datasource=PROMETHEUS)


def timeseries(title: str, targets: list, pos: g.GridPos, unit: str = "ms",
               description: str = "", max_points: int = 500, datasource: dict | None = None,
               **extra) -> g.TimeSeries:
    return g.TimeSeries(title=title, targets=targets, gridPos=pos, unit=unit, dataSource=datasource or DATASOURCE,
                        description=description, maxDataPoints=max_points, legendDisplayMode="list",
                        **extra)


def table(title: str, targets: list[InfluxDBTarget], pos: g.GridPos, description: str = "",
          sort_by: str | None = None, desc: bool = True, overrides: list | None = None,
          transformations: list | None = None) -> g.Table:
    sort = [g.TableSortByField(displayName=sort_by, desc=desc)] if sort_by else []
    return g.Table(title=title, targets=targets, gridPos=pos, dataSource=DATASOURCE,
                   description=description, sortBy=sort, filterable=True,
                   overrides=overrides or [], transformations=transformations or [])


def stat(title: str, targets: list[InfluxDBTarget], pos: g.GridPos, description: str = "",
         thresholds: Sequence[tuple[str, float | None]] = (("green", None), ("red", 1)),
         unit: str = "none", calc: str = "lastNotNull") -> g.Stat:
    steps = [{"color": c, "value": v} for c, v in thresholds]
    return g.Stat(title=title, targets=targets, gridPos=pos, dataSource=DATASOURCE,
                  description=description, colorMode="background", graphMode="none",
                  reduceCalc=calc, format=unit, thresholds=steps, noValue="0")


@dataclass(frozen=True)
class HeatmapColor:
    """Colour scale of a rows heatmap (Grafana's current model)."""

    scheme: str = "Inferno"
    scale: str = "exponential"
    exponent: float = 0.5
    min: float | None = None
    max: float | None = None

    def to_options(self) -> dict:
        out: dict[str, object] = {"mode": "scheme", "scheme": self.scheme, "scale": self.scale,
                                  "exponent": self.exponent, "fill": "dark-orange", "reverse": False,
                                  "steps": 128}
        if self.min is not None:
            out["min"] = self.min
        if self.max is not None:
            out["max"] = self.max
        return out


def by_interval(query: str, tiers: Sequence[tuple[str, int]]) -> list[str]:
    """One query per measurement of ``tiers`` (``(measurement, window ms)``, finest first), each
    of which answers only while the panel's column width ``$__interval_ms`` is at least its
    window and below the next one's. ``query`` holds ``{source}`` (the FROM) and ``{when}``:
    that condition (a comparison of two numbers once Grafana fills the macro, which InfluxQL
    folds before it reads anything, so a target that does not answer returns at once) and the
    tier's time filter. A window's point is at its start, so ``$timeFilter`` would drop the
    window the range begins inside and leave the first column empty; the filter takes it whole.

    So a panel over 6 h, whose columns are an hour wide, reads one point per hour and node, and
    the same panel over 3 h still draws its 20-minute columns from the 5-minute windows.

    Example::

        >>> a, b = by_interval("FROM {source} WHERE {when}", [("a", 300_000), ("b", 3_600_000)])
        >>> a
        'FROM "long"."a" WHERE $__interval_ms < 3600000 AND time > ${__from}ms - 300000ms AND time <= ${__to}ms'
        >>> b
        'FROM "long"."b" WHERE $__interval_ms >= 3600000 AND time > ${__from}ms - 3600000ms AND time <= ${__to}ms'
    """
    out = []
    for i, (measurement, window_ms) in enumerate(tiers):
        when = ([f"$__interval_ms >= {window_ms}"] if i else []) + \
               ([f"$__interval_ms < {tiers[i + 1][1]}"] if i + 1 < len(tiers) else []) + \
               [f"time > ${{__from}}ms - {window_ms}ms AND time <= ${{__to}}ms"]
        out.append(query.format(source=source(measurement), when=" AND ".join(when)))
    return out


def rows_heatmap(title: str, query: str | Sequence[str], pos: g.GridPos, row_tag: str, max_rows: int,
                 unit: str = "ms", description: str = "", color: HeatmapColor = HeatmapColor(),
                 max_points: int = 240, min_interval: str | None = None,
                 time_from: str | None = None) -> g.Heatmap:
    """A heatmap whose rows are the series of ``query`` (one per ``row_tag`` value); several
    queries (targets A, B, ...) when each answers a different column width (see
    :func:`by_interval`) and only one of them returns rows at a time.

    ``max_rows`` is how many rows the query can return at most (checked against
    :data:`HEATMAP_MAX_ROWS` here and against the data by the tests). Rows are
    named by the numeric tag (alias ``$tag_<row_tag>``) so Grafana sorts them
    numerically; zero cells are drawn (``filterValues`` below any latency). ``time_from``
    (e.g. ``30m``) makes the panel show the last stretch while the dashboard's range runs up to now
    (Grafana ignores it for an absolute range).
    """
    if max_rows > HEATMAP_MAX_ROWS:
        raise ValueError(f"heatmap {title!r} may draw {max_rows} rows; at most {HEATMAP_MAX_ROWS} "
                         f"stay readable in a browser: aggregate the rows")
    options = {
        "calculate": False,
        "cellGap": 0,
        "cellValues": {"unit": unit},
        "color": color.to_options(),
        "exemplars": {"color": "rgba(255,0,255,0.7)"},
        "filterValues": {"le": -1e-9},
        "legend": {"show": True},
        "rowsFrame": {"layout": "auto", "value": unit},
        "showValue": "never",
        "tooltip": {"mode": "single", "showColorScale": True, "yHistogram": False},
        "yAxis": {"axisPlacement": "left", "axisLabel": row_tag, "reverse": True, "unit": "none",
                  "decimals": 0},
    }
    extra = {
        "options": options,
        "fieldConfig": {"defaults": {"custom": {"hideFrom": {"legend": False, "tooltip": False, "viz": False},
                                                "scaleDistribution": {"type": "linear"}}},
                        "overrides": []},
        "rankscope": {"rowTag": row_tag, "maxRows": max_rows},
    }
    queries = [query] if isinstance(query, str) else list(query)
    targets = [target(q, chr(ord("A") + i), alias=f"$tag_{row_tag}") for i, q in enumerate(queries)]
    return g.Heatmap(title=title, targets=targets, gridPos=pos,
                     dataSource=DATASOURCE, description=description, maxDataPoints=max_points,
                     interval=min_interval, timeFrom=time_from, extraJson=extra)


def text_panel(title: str, markdown: str, pos: g.GridPos) -> g.Text:
    return g.Text(title=title, content=markdown, mode="markdown", gridPos=pos)


# ------------------------------------------------------------------ variables
@attr.s
class Variable(g.Template):
    """grafanalib's ``Template`` with the selection it opens with (``current``) set explicitly:
    a list of values for multi-select variables, which ``Template`` cannot express."""

    current = attr.ib(default=None)

    def to_json_data(self) -> dict:
        data = super().to_json_data()
        if self.current is not None:
            data["current"] = self.current
        return data


def query_variable(name: str, label: str, query: str, *, multi: bool = False, include_all: bool = False,
                   regex: str | None = None, default: str | list[str] | None = None,
                   sort: int = SORT_NUMERIC_ASC, refresh: int = REFRESH_ON_TIME_CHANGE,
                   hide: int = g.SHOW) -> g.Template:
    """A variable whose options come from an InfluxQL query (SHOW TAG VALUES, SELECT ...)."""
    current = None
    if default is not None:
        text = " + ".join(default) if isinstance(default, list) else default
        value = default if not include_all or default != "All" else ["$__all"]
        current = {"selected": True, "text": text, "value": value}
    return Variable(name=name, label=label, query=" ".join(query.split()), dataSource=DATASOURCE,
                    multi=multi, includeAll=include_all, regex=regex or "", sort=sort,
                    refresh=refresh, hide=hide, default=None, current=current)


@dataclass(frozen=True)
class Choice:
    """One option of a custom variable: what the user reads and what queries get."""

    text: str
    value: str


def custom_variable(name: str, label: str, choices: Sequence[Choice], default: Sequence[str],
                    multi: bool = True) -> g.Template:
    """A variable with a fixed list of options (``text : value`` pairs)."""
    chosen = set(default)
    options = [{"selected": c.value in chosen, "text": c.text, "value": c.value} for c in choices]
    query = ", ".join(f"{c.text} : {c.value}" for c in choices)
    picked = [c for c in choices if c.value in chosen]
    current = {"selected": True, "text": [c.text for c in picked] if multi else picked[0].text,
               "value": [c.value for c in picked] if multi else picked[0].value}
    return Variable(name=name, label=label, query=query, type="custom", multi=multi,
                    includeAll=False, options=options, default=None, current=current)


# ---------------------------------------------------------------- annotations
@dataclass(frozen=True)
class InfluxAnnotation:
    """An annotation fed by an InfluxQL query (Grafana's InfluxQL annotation model)."""

    name: str
    query: str
    text_column: str
    title_column: str = ""
    tags_column: str = ""
    color: str = "red"

    def to_json_data(self) -> dict:
        return {
            "datasource": DATASOURCE,
            "enable": True,
            "hide": False,
            "iconColor": self.color,
            "name": self.name,
            "query": " ".join(self.query.split()),
            "rawQuery": True,
            "tagsColumn": self.tags_column,
            "textColumn": self.text_column,
            "titleColumn": self.title_column,
            "type": "dashboard",
        }


# ------------------------------------------------------------------ dashboard
@dataclass
class DashboardSpec:
    """What a dashboard module returns: everything needed to build the JSON."""

    uid: str
    title: str
    description: str
    panels: list
    variables: list[g.Template] = field(default_factory=list)
    annotations: list[InfluxAnnotation] = field(default_factory=list)
    tags: list[str] = field(default_factory=lambda: ["rankscope"])
    time_from: str = "now-6h"
    refresh: str = "30s"
    links: list[dict] = field(default_factory=list)

    def build(self) -> g.Dashboard:
        return g.Dashboard(
            title=self.title, uid=self.uid, description=self.description, panels=self.panels,
            templating=g.Templating(list=self.variables),
            annotations=g.Annotations(list=self.annotations), tags=self.tags,
            time=g.Time(self.time_from, "now"), refresh=self.refresh, timezone="utc",
            editable=False, graphTooltip=g.GRAPH_TOOLTIP_MODE_SHARED_CROSSHAIR, links=self.links,
            schemaVersion=39,
        ).auto_panel_ids()

    def to_json(self) -> dict:
        """The dashboard model as plain JSON data (what Grafana stores)."""
        return json.loads(json.dumps(self.build().to_json_data(), default=_json_data, sort_keys=True))


def _json_data(obj: object) -> object:
    """grafanalib objects describe themselves with ``to_json_data()``; JSON takes that."""
    to_json_data = getattr(obj, "to_json_data", None)
    if to_json_data is None:
        raise TypeError(f"{type(obj).__name__} is not JSON serialisable")
    return to_json_data()


def dashboard_link(title: str, uid: str, include_vars: bool = True) -> dict:
    """A link in the dashboard's header to another rankscope dashboard."""
    return {"title": title, "type": "link", "url": f"/d/{uid}", "includeVars": include_vars,
            "keepTime": True, "icon": "dashboard", "tags": [], "asDropdown": False,
            "targetBlank": False, "tooltip": ""}
