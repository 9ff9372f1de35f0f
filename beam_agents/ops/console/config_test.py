"""The console's configuration file: every mistake in it is a ConsoleConfigError naming the
file and the setting, never a TypeError from deep inside."""

from __future__ import annotations

import pytest

from beam_agents.ops.console.config import ConsoleConfig, ConsoleConfigError
from beam_agents.testing.console import USERS

_KEYS = '{"active": "k1", "keys": {"k1": "' + "QUJD" * 11 + '"}}'


def _document(section: str = "", key: str = "", value: object = None) -> dict:
    document = {
        "kafka": {"topic_prefix": "loop", "bootstrap_servers": "127.0.0.1:9092"},
        "console": {"verify_mode": "off", "approvals_keyring": "keys.json"},
        "users": {"alice": {"role": "approver", "password_hash": USERS["alice"].password_hash}},
    }
    if section:
        document[section][key] = value
    return document


def test_a_well_formed_file_loads(tmp_path):
    (tmp_path / "keys.json").write_text(_KEYS)
    config = ConsoleConfig.from_document(_document(), base=tmp_path, source="console.toml")
    assert config.topics.prefix == "loop" and config.port == 8080
    assert config.database == tmp_path / "console.sqlite"


def test_cookies_are_secure_unless_the_file_says_the_console_is_served_over_plain_http(
    tmp_path,
):
    # Issue 38: every cookie was Secure, so a console served over plain HTTP by a host name
    # could sign nobody in, and nothing in the file could say how it is served.
    (tmp_path / "keys.json").write_text(_KEYS)
    config = ConsoleConfig.from_document(_document(), base=tmp_path, source="console.toml")
    assert config.secure_cookies is True
    plain = _document("console", "secure_cookies", False)
    assert not ConsoleConfig.from_document(plain, base=tmp_path, source="c.toml").secure_cookies


def test_trusted_proxies_are_none_unless_the_file_names_their_addresses(tmp_path):
    # Review 38: behind the recommended TLS proxy every client had the proxy's address, and
    # nothing in the file could name the proxy.
    (tmp_path / "keys.json").write_text(_KEYS)
    config = ConsoleConfig.from_document(_document(), base=tmp_path, source="console.toml")
    assert config.trusted_proxies == ()
    named = _document("console", "trusted_proxies", ["127.0.0.1", "10.0.0.0/8", "::1"])
    config = ConsoleConfig.from_document(named, base=tmp_path, source="console.toml")
    assert config.trusted_proxies == ("127.0.0.1", "10.0.0.0/8", "::1")


def test_the_effectors_inquiry_ring_is_read_from_the_file(tmp_path):
    (tmp_path / "keys.json").write_text(_KEYS)
    document = _document("console", "inquiry_keyring", "beam_agents.ops.demo:demo_inquiry_keyring")
    config = ConsoleConfig.from_document(document, base=tmp_path, source="console.toml")
    assert set(config.inquiry_keyring.keys) == {"demo-inquiry"}


@pytest.mark.parametrize(
    ("section", "key", "value"),
    [
        ("console", "approvals_keyring", 5),
        ("console", "inquiry_keyring", 9),
        ("console", "approvals_keyring", ["keys.json"]),
        ("console", "intent_keyring", 7),
        ("console", "database", 3),
        ("console", "host", []),
        ("console", "port", True),
        ("console", "secure_cookies", "no"),
        ("console", "trusted_proxies", "127.0.0.1"),
        ("console", "trusted_proxies", ["*"]),
        ("console", "trusted_proxies", ["proxy.lan"]),
        ("console", "trusted_proxies", ["10.0.0.1/8"]),
        ("console", "trusted_proxies", [1]),
        ("kafka", "topic_prefix", 5),
        ("kafka", "bootstrap_servers", {"host": "x"}),
    ],
)
def test_a_setting_of_the_wrong_type_is_a_config_error_naming_it(tmp_path, section, key, value):
    # Review: a number or a list where a path or a name belongs raised TypeError (a traceback
    # from `beam-agents console`), or was taken (a list as the host, true as port 1).
    (tmp_path / "keys.json").write_text(_KEYS)
    with pytest.raises(ConsoleConfigError, match=f"{section}.{key}"):
        ConsoleConfig.from_document(
            _document(section, key, value), base=tmp_path, source="console.toml"
        )
