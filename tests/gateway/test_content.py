"""One flattening of content parts: rendering, the ledger's signatures and the teacher read the
same text from a list of parts (joined by "\n", as the student's template renders them)."""

from __future__ import annotations

import pytest

from rlgw.gateway.content import content_text, non_text_part
from rlgw.gateway.errors import InvalidRequest
from rlgw.gateway.ledger.ledger import message_digest
from rlgw.gateway.model import render
from rlgw.gateway.teacher import client as teacher

PARTS = [{"type": "text", "text": "a"}, "b", {"type": "input_text", "text": "c"}]


def test_every_room_reads_the_same_text_from_parts() -> None:
    assert content_text(PARTS) == "a\nb\nc"
    assert render._content_text(0, PARTS) == "a\nb\nc"
    # The teacher labels the turn the student saw (it once joined parts with "").
    assert teacher._normalized({"role": "user", "content": PARTS})["content"] == "a\nb\nc"
    # The ledger signs a message by its text: parts and the joined string are the same message.
    assert message_digest({"role": "user", "content": PARTS}) == message_digest(
        {"role": "user", "content": "a\nb\nc"}
    )


def test_a_part_that_is_not_text_is_named_and_refused_by_rendering() -> None:
    image = {"type": "image_url", "image_url": {"url": "x"}}
    assert non_text_part(PARTS) is None and non_text_part([*PARTS, image]) == "image_url"
    assert non_text_part([{"type": "text", "text": None}]) == "text"  # a text part needs its text
    with pytest.raises(InvalidRequest, match="image_url"):
        render._content_text(0, [image])
