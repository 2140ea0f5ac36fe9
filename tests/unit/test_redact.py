"""Scrubbing secrets out of what a service records (shared/core/env/redact.py; the process's set:
shared/auth/secrets.py)."""

from __future__ import annotations

import random

import structlog

from reel.shared.auth import secrets
from reel.shared.core.env.redact import MIN_SECRET_CHARS, StreamScrubber, secrets_of
from reel.shared.proc.tools import ToolOutput
from reel.shared.runtime.config import NatsAuth
from reel.shared.runtime.logging import setup_logging

PW = "pw-0123456789abcdefghijklmnopqrstuv"
KEY = "sk-abcdefghijklmnop"


def test_values_become_markers_longest_first_and_short_or_unset_ones_are_left() -> None:
    s = secrets_of([("REEL_NATS_PASSWORD", PW), ("OPENAI_API_KEY", KEY), ("INNER", PW[3:20]), ("SHORT", "abc"),
                    ("UNSET", None), ("EMPTY", "")])
    assert [n for n, _ in s.pairs] == ["REEL_NATS_PASSWORD", "OPENAI_API_KEY", "INNER"]
    assert s.scrub(f"user x pass {PW}, key={KEY}; abc") == \
        "user x pass [redacted:REEL_NATS_PASSWORD], key=[redacted:OPENAI_API_KEY]; abc"
    assert s.scrub(f"part {PW[3:20]}") == "part [redacted:INNER]"
    assert s.scrub_bytes(f"{KEY}\n".encode()) == b"[redacted:OPENAI_API_KEY]\n"
    assert s.scrub_value({"a": [PW, 3, (KEY,)], "n": None}) == {
        "a": ["[redacted:REEL_NATS_PASSWORD]", 3, ("[redacted:OPENAI_API_KEY]",)], "n": None}
    assert not secrets_of([("X", "a" * (MIN_SECRET_CHARS - 1))])


def test_a_stream_scrubber_catches_a_value_split_across_chunks_at_every_cut() -> None:
    s = secrets_of([("REEL_NATS_PASSWORD", PW), ("OPENAI_API_KEY", KEY)])
    text = f"head {PW} middle {KEY}{KEY} tail {PW[:10]}".encode()
    rng = random.Random(7)
    for _ in range(300):
        cuts = sorted(rng.sample(range(1, len(text)), rng.randint(1, 12)))
        pieces = [text[i:j] for i, j in zip([0, *cuts], [*cuts, len(text)], strict=True)]
        scrubber = StreamScrubber(s)
        out = b"".join(scrubber.feed(p) for p in pieces) + scrubber.end()
        assert out == s.scrub_bytes(text), pieces
    assert StreamScrubber(secrets_of([])).feed(b"as is") == b"as is"


def test_a_tool_output_is_scrubbed_as_it_spools_and_its_cap_counts_the_scrubbed_bytes() -> None:
    s = secrets_of([("OPENAI_API_KEY", KEY)])
    with ToolOutput(1000, StreamScrubber(s)) as out:
        for i in range(0, len(KEY) * 3, 5):
            out.write((KEY * 3).encode()[i:i + 5])
        out.finish()
        assert out.read() == b"[redacted:OPENAI_API_KEY]" * 3 and not out.truncated
        assert out.tail_text() == "[redacted:OPENAI_API_KEY]" * 3


def test_the_process_remembers_its_credentials_and_every_log_line_is_scrubbed() -> None:
    seed = "SUAMLK2ZNL35WSMW37E7UD4VZ7ELPKW7DHC3BWBSD2GCZ7IUQQXZIORRBU"
    secrets.remember_auth(NatsAuth(user="executor", password=PW, nkey_seed=seed))
    assert secrets.scrub(f"{PW} {seed} executor") == \
        "[redacted:REEL_NATS_PASSWORD] [redacted:REEL_NATS_NKEY_SEED] executor"
    saved = {k: list(v) if isinstance(v, list) else v for k, v in structlog.get_config().items()}
    setup_logging("test")
    chain = list(structlog.get_config()["processors"])
    structlog.configure(**saved)
    assert chain[-2] is secrets.log_processor  # the last step before the renderer: tracebacks are scrubbed too
    with structlog.testing.capture_logs(processors=[secrets.log_processor]) as logs:
        structlog.get_logger("t").warning("tool.said", output=f"pw={PW}", nested={"k": [seed]})
    assert logs[0]["output"] == "pw=[redacted:REEL_NATS_PASSWORD]"
    assert logs[0]["nested"] == {"k": ["[redacted:REEL_NATS_NKEY_SEED]"]}
