"""Driving Debian's chromium from the tests (see cdp.py)."""
