"""Go and Java read the golden corpus and verify beam_agents signatures (tools/polyglot.sh),
including an intent this run signs in Python with a fresh key."""

from __future__ import annotations

import base64
import os
import secrets
import subprocess

import pytest

from beam_agents.intents.signing import Keyring, sign
from beam_agents.testing.samples import intent
from beam_agents.testing.schema_variants import SchemaVariant
from tools.workspace import source_root

# A field a newer binary added: Go and Java see it as unknown, and must verify it as signed.
NEWER = SchemaVariant.current().with_field("ToolIntent", "routing_hint", 21)


def _fresh_signed_intent(tmp_path):
    key_id, secret = f"fresh-{secrets.token_hex(4)}", secrets.token_bytes(32)
    newer = NEWER.message_class("ToolIntent").FromString(intent().SerializeToString())
    newer.routing_hint = "eu-west"
    signed = sign(newer, Keyring({key_id: secret}, active=key_id))
    path = tmp_path / "fresh_intent.binpb"
    path.write_bytes(signed.SerializeToString(deterministic=True))
    return {
        "BEAM_AGENTS_FRESH_INTENT": str(path),
        "BEAM_AGENTS_FRESH_KEY": base64.b64encode(secret).decode(),
        "BEAM_AGENTS_FRESH_KEY_ID": key_id,
        "BEAM_AGENTS_GOLDEN": str(source_root() / "golden" / "v1"),
    }


@pytest.mark.parametrize(
    ("language", "ran_fresh"),
    [
        ("go", "--- PASS: TestAnIntentSignedInPythonVerifies"),
        ("java", "Tests run: 4, Failures: 0, Errors: 0, Skipped: 0"),
    ],
)
def test_the_language_reads_the_corpus_and_verifies_signatures(tmp_path, language, ran_fresh):
    result = subprocess.run(
        ["bash", str(source_root() / "tools" / "polyglot.sh"), language],
        env={**os.environ, **_fresh_signed_intent(tmp_path)},
        capture_output=True,
        text=True,
        timeout=900,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    assert ran_fresh in output, output[-4000:]
