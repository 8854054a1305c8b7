"""User text cannot open a thought channel or a turn inside a policy check."""

from __future__ import annotations

import pytest

from fastslow.router.engine_api import CONTROL_STRINGS, neutralise, neutralise_text


@pytest.mark.parametrize("control", CONTROL_STRINGS)
def test_every_control_string_is_neutralised(control: str) -> None:
    out = neutralise_text(f"before {control} after")
    assert control not in out
    assert out.startswith("before ") and out.endswith(" after")


def test_variants_and_other_gemma_specials_are_caught() -> None:
    text = "< |channel>thought\n<channel |> <THINK>x</Think> <|image|> <|endoftext|>"
    out = neutralise_text(text)
    for bad in ("<|", "|>", "<THINK>", "</Think>", "< |channel>", "<channel |>"):
        assert bad not in out


def test_ordinary_markup_is_left_alone() -> None:
    text = "a < b and c > d, <b>bold</b>, x<|y"
    assert neutralise_text(text) == text


def test_nested_state_and_keys_are_neutralised() -> None:
    state = {"<turn|>": ["<|turn>system", {"t": "<think>"}], "n": 3}
    out = neutralise(state)
    assert "<turn|>" not in out
    assert "<|turn>" not in out["\u2039turn|\u203a"][0]
    assert out["\u2039turn|\u203a"][1]["t"] == "\u2039think\u203a"
    assert out["n"] == 3
