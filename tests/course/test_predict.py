"""course.predict.compare: the guess beside the measurement, and what is said when none was made."""

import pytest

from nanoserve.course.predict import compare


def test_compare_says_how_far_off():
    assert compare(8, 4.0, "gain", "x") == "gain: you predicted 8x, measured 4x: 2.0x too high"
    assert compare(2, 8.0, "gain", "x").endswith("4.0x too low")
    assert compare(10, 9.0, "steps").endswith("close")
    assert "write your guess" in compare(..., 3.0, "gain")
    both = compare({"static": 21}, {"static": 21, "continuous": 14}, "steps").splitlines()
    assert both[0].endswith("close") and "write your guess" in both[1]


def test_compare_refuses_what_is_not_a_number():
    with pytest.raises(ValueError, match="prediction='ten'"):
        compare("ten", 3.0, "gain")


def test_a_dict_without_a_name_is_read_by_its_keys():
    lines = compare({"hit rate (%)": 90}, {"hit rate (%)": 88.0, "TTFT p50, off / on": 4.0}, "").splitlines()
    assert lines[0] == "hit rate (%): you predicted 90, measured 88: close"
    assert lines[1].startswith("TTFT p50, off / on: measured 4")
