"""Go and Java read the golden corpus and verify beam_agents signatures (tools/polyglot.sh),
including messages this run signs in Python with a fresh key: a typed intent with a field they
do not know, a typed result, an effector's inquiry and its signature re-enveloped as a result
(which they must refuse), and a legacy-signed result (valid inside the window only)."""

from __future__ import annotations

import base64
import os
import secrets
import subprocess

import pytest

from beam_agents._protos import ToolIntent, ToolResult
from beam_agents.intents.signing import Keyring, sign, strip_signature
from beam_agents.testing.samples import intent
from beam_agents.testing.schema_variants import SchemaVariant
from tools.workspace import source_root

# A field a newer binary added: Go and Java see it as unknown, and must verify it as signed.
NEWER = SchemaVariant.current().with_field("ToolIntent", "routing_hint", 21)


def _fresh_signed_messages(tmp_path):
    key_id, secret = f"fresh-{secrets.token_hex(4)}", secrets.token_bytes(32)
    ring = Keyring({key_id: secret}, active=key_id)
    legacy = Keyring(
        {key_id: secret},
        active=key_id,
        sign_scheme=ToolIntent.HMAC_SHA256,
        legacy_until_ms=2**62,  # a signer: its own window is not under test
    )
    newer = NEWER.message_class("ToolIntent").FromString(intent().SerializeToString())
    newer.routing_hint = "eu-west"
    result = ToolResult(
        intent_id=intent().intent_id, entity_key=b"customer-42", seq=7, status=ToolResult.OK
    )
    # Shaped as the effector's inquiries are: its fields 1-8 read as a ToolResult's too.
    inquiry = sign(intent(step_index=1, attempt=0, kind=ToolIntent.APPROVAL, trace_id=b""), ring)
    as_result = ToolResult.FromString(
        strip_signature(inquiry.SerializeToString(deterministic=True))
        + ring.envelope(key_id, inquiry.signature, ToolResult.DESCRIPTOR)
    )
    files = {
        "INTENT": sign(newer, ring),
        "RESULT": sign(result, ring),
        "INQUIRY": inquiry,
        "INQUIRY_AS_RESULT": as_result,
        "LEGACY_RESULT": sign(result, legacy),
    }
    env = {
        "BEAM_AGENTS_FRESH_KEY": base64.b64encode(secret).decode(),
        "BEAM_AGENTS_FRESH_KEY_ID": key_id,
        "BEAM_AGENTS_GOLDEN": str(source_root() / "golden" / "v1"),
    }
    for name, message in files.items():
        path = tmp_path / f"{name.lower()}.binpb"
        path.write_bytes(message.SerializeToString(deterministic=True))
        env[f"BEAM_AGENTS_FRESH_{name}"] = str(path)
    return env


@pytest.mark.parametrize(
    ("language", "ran_fresh"),
    [
        ("go", "--- PASS: TestPythonSignaturesVerifyByTypeAndScheme"),
        ("java", "Tests run: 7, Failures: 0, Errors: 0, Skipped: 0"),
    ],
)
def test_the_language_verifies_signatures_by_type_and_scheme(tmp_path, language, ran_fresh):
    result = subprocess.run(
        ["bash", str(source_root() / "tools" / "polyglot.sh"), language],
        env={**os.environ, **_fresh_signed_messages(tmp_path)},
        capture_output=True,
        text=True,
        timeout=900,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    assert ran_fresh in output, output[-4000:]
