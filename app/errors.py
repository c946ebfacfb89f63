"""Errors that reach the user as one clear line and exit status 2."""

from __future__ import annotations


class UsageError(Exception):
    """Bad input from the user: the message names what was wrong."""
