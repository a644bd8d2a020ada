"""The Lua scripts as package data: loaded through importlib.resources, shared
routines pasted in by ``--@include``, and each script's ``@acks`` tag (whether
``acks="replicas:N"`` follows it with ``WAIT``). No server: the loader only."""

from __future__ import annotations

import hashlib
import json
from importlib import resources
from pathlib import Path

import pytest
import redis

import durabilis
from durabilis import _scripts
from durabilis._scripts import (
    MAX_INCLUDE_DEPTH,
    ScriptCall,
    ScriptSourceError,
    acks_tags,
    fuse,
    load,
    sources,
    waits,
)
from durabilis.cli import main

PACKAGE_LUA = Path(durabilis.__file__).resolve().parent / "lua"

# The regression anchor: the hand-kept list the store held before the scripts
# carried their @acks tags (durabilis/_store.py UNCONFIRMED_SCRIPTS, removed).
# Scripts that acks="replicas:N" does NOT follow with WAIT:
TODAYS_UNCONFIRMED = frozenset({
    "cb_read", "ckpt_count", "ckpt_find", "ckpt_get", "dlq_expired", "dlq_get",
    "dlq_stats", "idem_check", "layer_orphans", "layer_stats",
    "idem_release",
    # added after the list was removed: the web console's chart sample (a lost
    # sample is harmless; the console must keep working with a replica down)
    "console_sample",
})
# ...and layer_note, by its mode (ARGV[1]): no WAIT for these, WAIT for the others.
TODAYS_NOTE_UNCONFIRMED = frozenset({"rem", "leave", "none"})


def _tree(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return root


def _script(body: str, acks: str = "replicas") -> str:
    return f"--[[ s: a test script.\n\n@acks: {acks}\n]]\n{body}"


# --- package data ---------------------------------------------------------------------


def test_the_loader_finds_every_script_from_package_data() -> None:
    packaged = resources.files("durabilis") / "lua"
    on_disk = sorted(p.stem for p in PACKAGE_LUA.glob("*.lua"))
    assert on_disk, "durabilis/lua/ holds no script"
    assert sorted(n.name[:-4] for n in packaged.iterdir() if n.name.endswith(".lua")) == on_disk
    assert sorted(sources()) == on_disk
    assert Path(str(_scripts.lua_directory())) == PACKAGE_LUA


def test_shipped_scripts_are_fully_expanded_and_their_sha_is_the_expanded_texts() -> None:
    for name, text in sources().items():
        assert "--@include" not in text, name
        raw = (PACKAGE_LUA / f"{name}.lua").read_text(encoding="utf-8")
        if "--@include" not in raw:
            assert text.endswith(raw), name  # (after the ready() prelude)
    # redis-py hashes the registered text (no connection is made for it)
    registered = _scripts.ScriptRegistry(redis.Redis()).get("dlq_purge")
    assert registered.sha == hashlib.sha1(sources()["dlq_purge"].encode()).hexdigest()


# --- includes -------------------------------------------------------------------------


def test_an_include_line_is_replaced_by_the_files_text(tmp_path: Path) -> None:
    root = _tree(tmp_path, {
        "s.lua": _script("local a = 1\n--@include lib/two.lua\nreturn add(a)\n"),
        "lib/two.lua": (
            "-- lib/two.lua\n--@include lib/one.lua\nlocal function add(x) return one + x end"),
    })
    root_one = root / "lib" / "one.lua"
    root_one.write_text("local one = 1\n", encoding="utf-8")
    loaded = load(root)
    assert loaded.sources["s"].endswith(
        "\nlocal a = 1\n-- lib/two.lua\nlocal one = 1\n"
        "local function add(x) return one + x end\nreturn add(a)\n")
    assert sorted(loaded.sources) == ["s"]  # lib/ holds routines, not scripts


def test_a_file_is_pasted_once_per_script_at_its_first_include(tmp_path: Path) -> None:
    root = _tree(tmp_path, {
        "s.lua": _script("--@include lib/b.lua\n--@include lib/a.lua\nreturn f(g())\n"),
        "lib/a.lua": "local function g() return 1 end\n",
        "lib/b.lua": "--@include lib/a.lua\nlocal function f(x) return g() + x end\n",
    })
    text = load(root).sources["s"]
    assert text.count("local function g()") == 1
    assert text.endswith(
        "local function g() return 1 end\nlocal function f(x) return g() + x end\n"
        "return f(g())\n")


def test_an_unknown_include_is_an_error_at_load(tmp_path: Path) -> None:
    root = _tree(tmp_path, {"s.lua": _script("--@include lib/nope.lua\nreturn 1\n")})
    with pytest.raises(ScriptSourceError, match=r"s:5: unknown include 'lib/nope.lua'"):
        load(root)


def test_an_include_cycle_is_an_error_at_load(tmp_path: Path) -> None:
    root = _tree(tmp_path, {
        "s.lua": _script("--@include lib/a.lua\nreturn 1\n"),
        "lib/a.lua": "--@include lib/b.lua\n",
        "lib/b.lua": "--@include lib/a.lua\n",
    })
    with pytest.raises(ScriptSourceError, match=r"include cycle lib/a.lua -> lib/b.lua -> lib/a"):
        load(root)


def test_includes_nested_too_deep_are_an_error_at_load(tmp_path: Path) -> None:
    depth = MAX_INCLUDE_DEPTH + 1
    files = {"s.lua": _script("--@include lib/l1.lua\nreturn 1\n")}
    for i in range(1, depth):
        files[f"lib/l{i}.lua"] = f"--@include lib/l{i + 1}.lua\n"
    files[f"lib/l{depth}.lua"] = "local x = 1\n"
    with pytest.raises(ScriptSourceError, match="nest deeper than"):
        load(_tree(tmp_path, files))
    # one level less loads
    files[f"lib/l{depth - 1}.lua"] = "local x = 1\n"
    assert "local x = 1" in load(_tree(tmp_path, files)).sources["s"]


@pytest.mark.parametrize("line", [
    "--@include ../secret.lua", "--@include lib/x.txt", "--@include", "--@include lib/a.lua b",
])
def test_a_malformed_include_is_an_error_at_load(tmp_path: Path, line: str) -> None:
    root = _tree(tmp_path, {"s.lua": _script(f"{line}\nreturn 1\n"), "lib/a.lua": ""})
    with pytest.raises(ScriptSourceError):
        load(root)


def test_every_shared_routine_is_included_by_a_shipped_script() -> None:
    lib = sorted(p.name for p in (PACKAGE_LUA / "lib").glob("*.lua"))
    assert lib
    used = set()
    for path in PACKAGE_LUA.rglob("*.lua"):
        used |= {line.split()[1] for line in path.read_text(encoding="utf-8").splitlines()
                 if line.startswith("--@include ")}
    assert {f"lib/{n}" for n in lib} == used


# --- @acks tags -----------------------------------------------------------------------


def test_every_shipped_script_carries_an_acks_tag() -> None:
    # (load() refuses a script without one: the next test)
    assert set(acks_tags()) == set(sources())
    for name in sources():
        header = (PACKAGE_LUA / f"{name}.lua").read_text(encoding="utf-8").split("]]", 1)[0]
        assert header.count("\n@acks:") == 1, name


@pytest.mark.parametrize("acks", [None, "maybe", "replicas, replicas when ARGV[1] in a",
                                  "none, replicas when ARGV[0] in a", "replicas\n@acks: none"])
def test_a_script_without_a_valid_acks_tag_does_not_load(tmp_path: Path, acks: str | None) -> None:
    text = "--[[ s: no tag.\n]]\nreturn 1\n" if acks is None else _script("return 1\n", acks)
    with pytest.raises(ScriptSourceError, match="@acks"):
        load(_tree(tmp_path, {"s.lua": text}))


def test_the_scripts_the_tags_exempt_from_wait_are_todays_list() -> None:
    tags = acks_tags()
    assert {n for n, t in tags.items() if not t.waits} == TODAYS_UNCONFIRMED
    conditional = {n for n, t in tags.items() if t.arg}
    assert conditional == {"layer_note"}
    for name in tags:
        if name == "layer_note":
            continue
        assert waits(ScriptCall(name, ["k"], ["x"])) is (name not in TODAYS_UNCONFIRMED), name


@pytest.mark.parametrize("mode", ["add", "rem", "leave", "renew", "at", "none", b"rem", b"add"])
def test_layer_note_waits_by_its_mode_as_before(mode: str | bytes) -> None:
    text = mode.decode() if isinstance(mode, bytes) else mode
    call = ScriptCall("layer_note", ["i", "s"], [mode, 1000, 0])
    assert waits(call) is (text not in TODAYS_NOTE_UNCONFIRMED)
    assert waits(ScriptCall("layer_note", ["i", "s"], [])) is True


def test_a_fused_step_waits_when_one_script_is_plainly_replicas() -> None:
    def c(name: str, *args: str) -> ScriptCall:
        return ScriptCall(name, ["k"], list(args))

    assert waits(fuse([c("idem_claim"), c("layer_note", "add")]))
    assert not waits(fuse([c("idem_release"), c("layer_note", "add")]))
    assert not waits(fuse([c("idem_check"), c("cb_read")]))
    assert waits(fuse([c("idem_check"), c("cb_before")]))


def test_each_tag_reads_back_as_it_prints() -> None:
    for name, tag in acks_tags().items():
        assert _scripts.acks_tag(name, f"--[[ {name}\n@acks: {tag}\n]]\n") == tag, name


# --- `durabilis scripts`: what an operator reads ----------------------------------------


def test_the_cli_lists_every_script_and_prints_one_as_sent(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["scripts", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["name"] for r in rows] == sorted(sources())
    for row in rows:
        assert row["sha1"] == hashlib.sha1(sources()[row["name"]].encode()).hexdigest()
        assert row["acks"] == str(acks_tags()[row["name"]])
    assert main(["scripts", "dlq_cleanup"]) == 0
    assert capsys.readouterr().out == sources()["dlq_cleanup"]  # expanded, as EVALSHA runs it
    assert main(["scripts", "no_such_script"]) == 1
    assert "no script 'no_such_script'" in capsys.readouterr().err
