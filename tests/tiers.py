"""The test tiers: every test has exactly one (tests/conftest.py assigns it), and `.ci/run` runs
the README's pytest once per tier, in this order."""

TIERS = ("unit", "integration", "e2e")
