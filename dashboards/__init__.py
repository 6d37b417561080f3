"""The dashboards: what Grafana and people see, as code.

Owns the last hop, serving: Grafana dashboards (NOC wall, rank x stage heatmap, L2,
incident) as grafanalib objects, their alert rules and routing, the provisioning files
generated from them, and the HTML incident report. Queries read the analyzer's outputs and
rollups; every InfluxQL ``FROM`` comes from the core.

May import: the core (``rankscope``) only, and itself; no other component.
"""
