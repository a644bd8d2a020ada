"""The ACL line an operator copies from docs/operations.md grants what durabilis sends."""

from __future__ import annotations

from tests.support.acl import documented_setuser, granted, plain_commands, script_commands

# What the stores send themselves on an application's behalf: scripts, their
# (re)loading, WAIT (acks="replicas:N"), PING. (SCAN, for counts, is the
# operator's: not granted to apps.)
STORE_COMMANDS = {"evalsha", "eval", "script|load", "wait", "ping"}
# What redis-py's cluster client reads to learn the slot map.
CLUSTER_CLIENT_COMMANDS = {"cluster|slots", "cluster|shards", "command"}


def test_the_documented_user_is_limited_to_its_namespace_and_named_commands() -> None:
    user, rules = documented_setuser()
    assert user == "durabilis"
    assert rules[:1] == ["on"]
    assert "resetkeys" in rules and "~durabilis:*" in rules
    assert [r for r in rules if r.startswith("~")] == ["~durabilis:*"]
    assert "-@all" in rules and not [r for r in rules if r.startswith("+@")]


def test_the_documented_acl_grants_every_command_a_lua_script_calls() -> None:
    _, rules = documented_setuser()
    missing = script_commands() - granted(rules)
    assert not missing, f"add {sorted(missing)} to the ACL line in docs/operations.md"


# Sent to the Sentinels (doctor), never to a data node: their users are their own.
TO_SENTINELS = {"sentinel"}
# Unknown to Redis 7.0, whose ACL SETUSER refuses the name: granted on >= 7.2 as
# the bullet under the line says (acks="...+fsync").
FROM_7_2 = {"waitaof"}
# Only with acks="replicas:N" (its one version check), as the bullet says: an
# application's user without acks needs no INFO (the operator's line has it).
WITH_ACKS = {"info"}
# The CLI's finding of a key as its user knows it (idem show, dlq ls --key):
# the operator's, never an application's (ACL key patterns do not filter SCAN).
OPERATOR_SCANS = {"scan", "hscan"}


def test_the_documented_acl_grants_what_the_stores_pillars_and_cluster_client_send() -> None:
    _, rules = documented_setuser()
    not_on_the_line = TO_SENTINELS | FROM_7_2 | WITH_ACKS | OPERATOR_SCANS
    sent = STORE_COMMANDS | CLUSTER_CLIENT_COMMANDS | (plain_commands() - not_on_the_line)
    missing = sent - granted(rules)
    assert not missing, f"add {sorted(missing)} to the ACL line in docs/operations.md"


def test_the_application_user_cannot_list_other_tenants_keys() -> None:
    _, rules = documented_setuser()
    assert "scan" not in granted(rules) and "keys" not in granted(rules)
