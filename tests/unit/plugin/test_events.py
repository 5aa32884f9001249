from __future__ import annotations

import pytest

from nri_gpu.plugin.events import (
    VALID_EVENTS_CRIO_1_33,
    VALID_EVENTS_V0_9,
    VALID_EVENTS_V0_10,
    Event,
    events_of,
    mask_of,
    parse_version,
    valid_events,
)


def test_bits_follow_the_wire_rule() -> None:
    assert Event.CREATE_CONTAINER.bit == 0x008
    assert mask_of([Event.CREATE_CONTAINER, Event.REMOVE_CONTAINER]) == 0x408
    assert events_of(0x408) == [Event.CREATE_CONTAINER, Event.REMOVE_CONTAINER]
    assert mask_of(Event) == VALID_EVENTS_V0_10


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1.7.24~ds1", (1, 7, 24)),
        ("v2.1.4", (2, 1, 4)),
        ("2.1.4+unknown", (2, 1, 4)),
        ("1.33", (1, 33, 0)),
        ("(devel)", None),
        ("0.0.0-unknown", None),
        ("", None),
    ],
)
def test_parse_version_is_lenient(text: str, expected: tuple[int, int, int] | None) -> None:
    assert parse_version(text) == expected


@pytest.mark.parametrize(
    ("name", "version", "nri", "expected"),
    [
        ("containerd", "1.7.24~ds1", "", VALID_EVENTS_V0_9),
        ("containerd", "2.1.9", "", VALID_EVENTS_V0_9),
        ("containerd", "2.2.1", "", VALID_EVENTS_V0_10),
        ("containerd", "2.3.0", "v0.12.1", VALID_EVENTS_V0_10),
        ("containerd", "1.7.24", "(devel)", VALID_EVENTS_V0_9),
        ("cri-o", "1.32.0", "", VALID_EVENTS_V0_9),
        ("cri-o", "1.33.1", "", VALID_EVENTS_CRIO_1_33),
        ("cri-o", "1.34.0", "", VALID_EVENTS_V0_10),
        ("something-new", "9.9", "", VALID_EVENTS_V0_9),
        ("containerd", "garbage", "", VALID_EVENTS_V0_9),
    ],
)
def test_valid_events_by_runtime(name: str, version: str, nri: str, expected: int) -> None:
    assert valid_events(name, version, nri) == expected
