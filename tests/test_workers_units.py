"""Edge cases of hugginggpt/workers.py, each pinned where a user would notice it broken (mutation audit: docs/TESTING.md)."""
