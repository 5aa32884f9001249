"""PluginError: the text the runtime shows in a failed CRI call is one bounded, printable line."""

from __future__ import annotations

import pytest

from nri_gpu.plugin.errors import MAX_MESSAGE, PluginError


def test_control_characters_are_escaped() -> None:
    error = PluginError('env "X\n2026-01-01 forged\r\x1b[2J"')
    assert str(error) == 'env "X\\n2026-01-01 forged\\r\\x1b[2J"'
    assert error.args == (str(error),)


@pytest.mark.parametrize("size", [MAX_MESSAGE + 1, 5 << 20])
def test_a_huge_message_is_cut_to_the_cap_and_says_so(size: int) -> None:
    text = str(PluginError("x" * size))
    assert len(text) <= MAX_MESSAGE and text.endswith(f"... ({size} characters in all)"), text[-80:]


def test_a_short_printable_message_is_unchanged() -> None:
    assert str(PluginError('GPU 4 does not exist; this node has 4 GPUs ("ünïcode")')) == (
        'GPU 4 does not exist; this node has 4 GPUs ("ünïcode")'
    )
