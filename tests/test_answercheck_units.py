"""The answer held to the results (hugginggpt/answercheck.py): files as served, none invented, failures told."""

from __future__ import annotations

from hugginggpt.answercheck import check_answer

RESULTS = {
    0: {"task": {"task": "text-to-image", "id": 0}, "inference result": {"generated image": "/images/ab12.png"}},
    1: {"task": {"task": "text-to-speech", "id": 1}, "inference result": {"generated audio": "/audios/cd34.wav"}},
}
FAILED = {
    0: {"task": {"task": "image-to-text", "id": 0}, "inference result": {"error": {"message": "model crashed"}}},
}


def test_an_answer_true_to_the_results_is_left_as_it_is():
    text = "Here is your fox: /images/ab12.png, and it speaks: /audios/cd34.wav."
    assert check_answer(text, RESULTS) == text


def test_a_path_without_its_slash_or_under_public_is_written_as_served():
    text = "See images/ab12.png and public/audios/cd34.wav."
    assert check_answer(text, RESULTS) == "See /images/ab12.png and /audios/cd34.wav."


def test_an_invented_file_of_the_one_kind_made_becomes_the_real_one():
    assert check_answer("Your picture: /images/fox.png", RESULTS) .startswith("Your picture: /images/ab12.png")


def test_an_invented_file_of_a_kind_nothing_made_is_marked():
    out = check_answer("Your video: /videos/fox.mp4", RESULTS)
    assert "/videos/fox.mp4 [no such file was made]" in out


def test_files_the_answer_left_out_are_added_with_their_tasks():
    out = check_answer("I drew a fox.", RESULTS)
    assert out.startswith("I drew a fox.\n\nFiles made: ")
    assert "/images/ab12.png (task 0, text-to-image)" in out and "/audios/cd34.wav (task 1, text-to-speech)" in out


def test_a_failed_task_called_done_is_reported_as_failed():
    out = check_answer("The image shows a cat on a sofa.", FAILED)
    assert out.endswith("Task 0 (image-to-text) failed: model crashed")
    told = "I could not caption the image: the model crashed."
    assert check_answer(told, FAILED) == told
