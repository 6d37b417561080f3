"""The collector's non-blocking writer: points out of the training loop, each counted once.

:mod:`.background` holds :class:`BackgroundWriter` (a bounded queue, one thread, retries of
a batch whose fate is unknown) and :func:`open_writer`; :mod:`.write_fate` says what a failed
write means for its batch; :mod:`.drop_report` is the ``event`` point in which a rank reports
what it dropped.

May import: the core (``rankscope``) and itself.
"""

from collector.writer.background import BackgroundWriter, WriterStats, open_writer
from collector.writer.drop_report import DROP_EVENT

__all__ = ["DROP_EVENT", "BackgroundWriter", "WriterStats", "open_writer"]
