"""The packaged wheel is what users get: it must carry every Lua script."""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_installed_wheel_ships_and_loads_every_lua_script(tmp_path: Path) -> None:
    lua = ROOT / "durabilis" / "lua"
    expected = sorted(p.name for p in lua.glob("*.lua"))
    assert expected, "the source tree has no durabilis/lua/*.lua"
    # (the shared routines the scripts include: durabilis/lua/lib/)
    expected_lib = sorted(p.relative_to(lua).as_posix() for p in lua.glob("lib/*.lua"))
    assert expected_lib, "the source tree has no durabilis/lua/lib/*.lua"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         "-w", str(tmp_path / "dist"), str(ROOT)],
        check=True,
    )
    (wheel,) = (tmp_path / "dist").glob("durabilis-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        names = [n[len("durabilis/lua/"):] for n in zf.namelist() if n.startswith("durabilis/lua/")]
        assert "durabilis/py.typed" in zf.namelist()
        web = ROOT / "durabilis" / "web"  # the console's templates and stylesheet
        assets = sorted(str(p.relative_to(ROOT)) for p in web.rglob("*")
                        if p.suffix in (".html", ".css"))
        assert assets and set(assets) <= set(zf.namelist())
    assert sorted(n for n in names if "/" not in n) == expected
    assert sorted(n for n in names if n.startswith("lib/")) == expected_lib

    target = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(target),
         str(wheel)],
        check=True,
    )
    # Import the INSTALLED copy (not the source tree) and load the scripts from it.
    probe = (
        "import json, durabilis._scripts as s; "
        "print(json.dumps({'dir': str(s.lua_directory()), 'names': sorted(s.sources())}))"
    )
    out = subprocess.run(
        [sys.executable, "-I", "-c", f"import sys; sys.path.insert(0, {str(target)!r}); {probe}"],
        check=True, capture_output=True, text=True, cwd=tmp_path,
    )
    loaded = json.loads(out.stdout)
    assert Path(loaded["dir"]).is_relative_to(target)
    assert loaded["names"] == [n[:-4] for n in expected]
