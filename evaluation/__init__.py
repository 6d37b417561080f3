"""Evaluation: what shows and measures rankscope end to end.

Owns ``rankscope demo`` (IL-0477), ``rankscope torch-demo``, the accuracy suite and the L1
calibration. May import every package of the project; nothing imports it.
"""
