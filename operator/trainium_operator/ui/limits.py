"""The UI's resource defaults, importable without numpy (the CLI shows them in --help)."""

from __future__ import annotations

DEFAULT_MEMORY_BUDGET = 512 << 20
"""Bytes of loaded profiles and decoded timeline ranks held: below the chart's 1 GiB container
limit, since the server itself (about 120 MiB idle), a decode in flight and the JSON answers
need the rest."""

DEFAULT_SUMMARY_CACHE_BYTES = 2 << 30
"""Bytes of rank summaries kept on disk (about 12 MB per million events)."""

DEFAULT_SUMMARISE_AHEAD = 16
"""Discovered profiles that may wait to be summarised in the background before their first
open (0: a profile is summarised only when it is opened)."""

DEFAULT_SUMMARISE_WRITTEN_EVERY_S = 15.0
"""Seconds between two looks at the TrainingJob list for profiles written since (with
--list-jobs), which are then summarised ahead too (0: only listed profiles are)."""
