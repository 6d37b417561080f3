"""Act on verdicts: drain the culprit node through the cluster's scheduler (Slurm, Kubernetes)
under a safety policy, record every step in the store (``action``), tell Alertmanager.

A component like the others: it imports only the core, reads the incidents the analyzer wrote
and writes its records back (docs/actions.md). ``rankscope act`` runs one pass; the analyzer
service runs one after each cycle when ``[actions] mode`` asks (through the entry-point group
``rankscope.after_cycle``, without importing this package).
"""
