"""Edge cases of hugginggpt/modelhost/pool.py, each pinned where a user would notice it broken (mutation audit: docs/TESTING.md)."""
