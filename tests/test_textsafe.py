"""Edge cases of hugginggpt/textsafe.py, each pinned where a user would notice it broken (mutation audit: docs/TESTING.md)."""

from hugginggpt.textsafe import clean_text, one_line


def test_each_lone_surrogate_becomes_the_replacement_character():
    assert clean_text("a\ud800b\udbffc\udc00d\udfffe") == "a\ufffdb\ufffdc\ufffdd\ufffde"


def test_text_without_surrogates_is_returned_unchanged():
    text = "plain ascii, é, 中文, emoji \U0001f600, edges \ud7ff\ue000, and XX"
    assert clean_text(text) == text
    assert clean_text("") == ""


def test_one_line_turns_each_run_of_control_characters_into_one_space():
    assert one_line("a\nb\r\n\tc\x00d\x1b[2Je\x7ff\x80\x9fg") == "a b c d [2Je f g"
    assert one_line("\x1f") == " " and one_line("\x20\x7e\xa0é中") == "\x20\x7e\xa0é中"  # printable text stays
