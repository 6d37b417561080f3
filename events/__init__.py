"""Out-of-band events from the monitoring people already run (Prometheus Alertmanager, Grafana
alerting, scripts and runbooks) written into the ``event`` measurement, where the analyzer judges
them against the traces.

Owns the receiver (``rankscope events serve``), the payload parsers, and ``rankscope event add``.
May import: the core (``rankscope``) only, and itself; no other component.
"""
