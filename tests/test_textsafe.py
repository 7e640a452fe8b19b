"""Edge cases of hugginggpt/textsafe.py, each pinned where a user would notice it broken (mutation audit: docs/TESTING.md)."""

from hugginggpt.textsafe import clean_text


def test_each_lone_surrogate_becomes_the_replacement_character():
    assert clean_text("a\ud800b\udbffc\udc00d\udfffe") == "a\ufffdb\ufffdc\ufffdd\ufffde"


def test_text_without_surrogates_is_returned_unchanged():
    text = "plain ascii, é, 中文, emoji \U0001f600, edges \ud7ff\ue000, and XX"
    assert clean_text(text) == text
    assert clean_text("") == ""
