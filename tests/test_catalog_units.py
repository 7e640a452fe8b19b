"""Edge cases of hugginggpt/catalog.py, each pinned where a user would notice it broken (mutation audit: docs/TESTING.md)."""
