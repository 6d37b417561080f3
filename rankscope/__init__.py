"""rankscope: fail-slow diagnosis for large distributed GPU training jobs.

Core shared by the collector (what writes), the analyzer (what reads, scores and
writes back) and the dashboards (what Grafana shows): topology, schema, line
protocol, store, configuration and the command line.
"""

__version__ = "0.1.0"
