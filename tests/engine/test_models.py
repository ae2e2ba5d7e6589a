"""The job id codec: server ids are 16 bytes shown as 26 Crockford base32 characters whose
text order is their byte order (due time first), so ids sort by due time as text too."""

from __future__ import annotations

import os
import random

import pytest

from cluster_dq.models import (
    decode_id,
    encode_id,
    id_due_ms,
    id_due_ms_of_text,
    id_to_member,
    id_to_text,
    new_id,
)

CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"


def reference_encode(raw: bytes) -> str:
    """The definition, one 5-bit digit at a time."""
    n = int.from_bytes(raw, "big")
    return "".join(CROCKFORD[(n >> (5 * i)) & 31] for i in reversed(range(26)))


def test_ids_round_trip_and_match_the_definition() -> None:
    rng = random.Random(7)
    samples = [bytes(16), b"\xff" * 16] + [rng.randbytes(16) for _ in range(5000)]
    for raw in samples:
        text = encode_id(raw)
        assert text == reference_encode(raw) and len(text) == 26
        assert decode_id(text) == raw


def test_text_order_is_byte_order_and_due_time_is_readable_from_the_text() -> None:
    raws = [
        new_id(1_800_000_000_000 + random.randrange(10**9), random.randrange(4))
        for _ in range(2000)
    ]
    assert sorted(raws) == sorted(raws, key=encode_id)
    for raw in raws[:200]:
        text = id_to_text(raw)
        assert id_to_member(text) == raw
        assert id_due_ms_of_text(text) == id_due_ms(raw)


@pytest.mark.parametrize(
    "text",
    [
        "",
        "0" * 25,
        "0" * 27,
        "8" + "0" * 25,
        "0" * 25 + "I",
        "0" * 25 + "u",
        "0" * 25 + "!",
        "my-client-id",
    ],
)
def test_anything_else_is_not_a_server_id(text: str) -> None:
    assert decode_id(text) is None and id_due_ms_of_text(text) is None
    assert id_to_member(text) == text.encode()


def test_a_client_id_stays_itself() -> None:
    assert id_to_text(b"order-42") == "order-42" and id_to_text(os.urandom(8).hex().encode())
