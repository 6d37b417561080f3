"""Out-of-band events from the monitoring people already run (Prometheus Alertmanager, Grafana
alerting, scripts and runbooks) written into the ``event`` measurement, where the analyzer judges
them against the traces."""
