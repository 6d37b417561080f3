"""``rankscope report``: an incident record as an HTML page with PNG figures (placeholder)."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    """Filled in below; registered early so the command list is stable."""
