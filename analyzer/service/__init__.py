"""The analyzer as a service: the cycle that runs the flow, its schedule, its commands.

Runs the hops (read -> detect -> score -> diagnosis -> write) for every job. Owns the cycle
(:class:`~analyzer.service.analyzer_service.AnalyzerService`: per job, read whole iterations,
feed the job's :class:`~analyzer.job_analyzer.JobAnalyzer`, write what it found), the
APScheduler interval and what it logs (:mod:`~analyzer.service.schedule`), the reload of
thresholds between cycles (:mod:`~analyzer.service.config_watch`) and the commands
``rankscope analyze`` (:mod:`~analyzer.service.analyze_cli`) and ``rankscope rollup``
(:mod:`~analyzer.service.rollup_cli`), found through the ``rankscope.commands`` entry points.

May import: the core (``rankscope``), every part of the analyzer (``read/``, ``write/``,
``job_analyzer``, ``config``, and ``diagnosis/``'s event type) and itself; nothing in the
analyzer imports it.
"""
