"""Configuration precedence: defaults < pyproject.toml < environment < command line."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from metrale_orch.cli import main
from metrale_orch.config import ConfigError, load_config


def pyproject(root: Path, body: str) -> None:
    root.mkdir(parents=True, exist_ok=True)
    (root / "pyproject.toml").write_text(f'[project]\nname = "x"\n\n[tool.metrale-orch]\n{body}')


def test_defaults_without_any_setting(tmp_path: Path) -> None:
    cfg = load_config(tmp_path, {"HOME": "/home/u"})
    assert cfg.build_dir == tmp_path / "build"
    assert cfg.local_cache == Path("/home/u/.cache/metrale-orch")
    assert (cfg.cache, cfg.cache_mode, cfg.cache_namespace, cfg.cache_timeout) == (
        "",
        "read-write",
        "",
        2.0,
    )
    assert set(cfg.sources.values()) == {"default"}
    xdg = load_config(tmp_path, {"HOME": "/home/u", "XDG_CACHE_HOME": "/xdg"})
    assert xdg.local_cache == Path("/xdg/metrale-orch")


def test_each_level_outranks_the_one_below_and_says_so(tmp_path: Path) -> None:
    pyproject(
        tmp_path,
        'build_dir = "out"\ncache = "s3://team/a"\ncache_mode = "read-only"\n'
        "cache_timeout = 5\nstorage_options = { anon = true }\n",
    )
    env = {"HOME": "/h", "METRALE_ORCH_CACHE": "gs://team/b", "METRALE_ORCH_CACHE_TIMEOUT": "3"}
    cfg = load_config(tmp_path, env, {"cache_timeout": "1.5"})
    assert cfg.build_dir == tmp_path / "out"  # relative to the root
    assert cfg.cache == "gs://team/b"
    assert cfg.cache_mode == "read-only"
    assert cfg.cache_timeout == 1.5
    assert dict(cfg.storage_options) == {"anon": True}
    assert cfg.sources["build_dir"] == "pyproject"
    assert cfg.sources["cache"] == "env"
    assert cfg.sources["cache_timeout"] == "cli"
    assert cfg.sources["cache_namespace"] == "default"
    assert cfg.to_dict()["build_dir"] == "out"


def test_storage_options_from_the_environment_are_json(tmp_path: Path) -> None:
    env = {"HOME": "/h", "METRALE_ORCH_STORAGE_OPTIONS": '{"endpoint_url": "http://x:9000"}'}
    assert dict(load_config(tmp_path, env).storage_options) == {"endpoint_url": "http://x:9000"}
    with pytest.raises(ConfigError, match="METRALE_ORCH_STORAGE_OPTIONS: storage_options: must"):
        load_config(tmp_path, {"HOME": "/h", "METRALE_ORCH_STORAGE_OPTIONS": "{nope"})


@pytest.mark.parametrize(
    ("body", "env", "match"),
    [
        (
            "cache_mod = 'off'\n",
            {},
            r"pyproject.toml \[tool.metrale-orch\]: cache_mod: unknown key",
        ),
        ("cache_mode = 'sometimes'\n", {}, "cache_mode: must be one of read-write, read-only, off"),
        ("cache_timeout = -1\n", {}, "cache_timeout: must be a positive number of seconds"),
        ("cache_timeout = true\n", {}, "cache_timeout: must be a positive number"),
        ("cache = 3\n", {}, "cache: must be a string"),
        ("log_backups = 1.5\n", {}, "log_backups: must be a non-negative integer"),
        ("", {"METRALE_ORCH_CACHE_TIMEOUT": "soon"}, "environment METRALE_ORCH_CACHE_TIMEOUT"),
        ("", {"METRALE_ORCH_CACHE_MODE": "rw"}, "environment METRALE_ORCH_CACHE_MODE"),
    ],
)
def test_bad_values_name_where_and_which_key(
    tmp_path: Path, body: str, env: dict[str, str], match: str
) -> None:
    pyproject(tmp_path, body)
    with pytest.raises(ConfigError, match=match):
        load_config(tmp_path, {"HOME": "/h", **env})


def test_unknown_key_lists_the_known_ones(tmp_path: Path) -> None:
    pyproject(tmp_path, "colour = 'red'\n")
    with pytest.raises(ConfigError) as info:
        load_config(tmp_path, {"HOME": "/h"})
    assert info.value.key == "colour" and "cache_mode" in str(info.value)


def test_unparseable_pyproject(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text("[tool.metrale-orch\n")
    with pytest.raises(ConfigError, match=r"pyproject.toml: \(file\): cannot be read"):
        load_config(tmp_path, {"HOME": "/h"})


def test_cli_set_outranks_everything_and_is_checked(tmp_path: Path) -> None:
    pyproject(tmp_path, 'cache_mode = "off"\n')
    (tmp_path / "kernels").mkdir()
    env = {"HOME": str(tmp_path), "METRALE_ORCH_CACHE_MODE": "read-only"}

    def run(*argv: str) -> tuple[int, str, str]:
        out, err = io.StringIO(), io.StringIO()
        code = main(["--root", str(tmp_path), *argv], environ=env, out=out, err=err)
        return code, out.getvalue(), err.getvalue()

    # `cache stats` shows the mode in force: pyproject says off, the environment
    # read-only, the command line read-write.
    code, out, _ = run("cache", "stats")
    assert code == 0 and "mode: read-only" in out
    code, out, _ = run("--set", "cache_mode=read-write", "cache", "stats")
    assert code == 0 and "mode: read-write" in out
    code, _, err = run("--set", "colour=red", "cache", "stats")
    assert code == 2 and "command line: colour: unknown setting" in err
    code, _, err = run("--set", "no-equals-sign", "check")
    assert code == 2 and "expected KEY=VALUE" in err


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("kernels", "is the kernel tree (kernels/)"),
        ("kernels/hopper/out", "lies inside the kernel tree (kernels/)"),
        (".", "is the project root"),
        ("..", "contains the kernel tree (kernels/)"),
    ],
)
def test_build_dir_may_not_touch_the_kernel_tree(tmp_path: Path, value: str, problem: str) -> None:
    root = tmp_path / "proj"
    (root / "kernels").mkdir(parents=True)
    # From the environment: the message names the variable and the key.
    with pytest.raises(ConfigError) as info:
        load_config(root, {"HOME": "/h", "METRALE_ORCH_BUILD_DIR": value})
    assert info.value.key == "build_dir"
    assert str(info.value).startswith("environment METRALE_ORCH_BUILD_DIR: build_dir: ")
    assert problem in str(info.value)
    # From pyproject.toml and from the command line: named as such.
    pyproject(root, f'build_dir = "{value}"\n')
    with pytest.raises(ConfigError, match=r"^pyproject.toml \[tool.metrale-orch\]: build_dir: "):
        load_config(root, {"HOME": "/h"})
    (root / "pyproject.toml").unlink()
    with pytest.raises(ConfigError, match=r"^command line: build_dir: "):
        load_config(root, {"HOME": "/h"}, {"build_dir": value})


def test_build_dir_through_a_symlink_into_kernels_is_refused(tmp_path: Path) -> None:
    (tmp_path / "kernels").mkdir()
    (tmp_path / "out").symlink_to(tmp_path / "kernels")
    with pytest.raises(ConfigError, match="build_dir: 'out' is the kernel tree"):
        load_config(tmp_path, {"HOME": "/h", "METRALE_ORCH_BUILD_DIR": "out"})


def test_build_dir_beside_kernels_is_fine(tmp_path: Path) -> None:
    (tmp_path / "kernels").mkdir()
    for value in ("build", "out/kernels-build", str(tmp_path.parent / "elsewhere")):
        cfg = load_config(tmp_path, {"HOME": "/h", "METRALE_ORCH_BUILD_DIR": value})
        assert cfg.sources["build_dir"] == "env"


def test_check_reports_configuration_errors(tmp_path: Path) -> None:
    """`check` answers "will the build accept this?": a configuration that does not load
    is refused in one line, as every command refuses it, before the tree is read."""
    (tmp_path / "kernels").mkdir()
    (tmp_path / "pyproject.toml").write_text("[tool.metrale-orch\n")
    out, err = io.StringIO(), io.StringIO()
    code = main(["--root", str(tmp_path), "check"], environ={"HOME": "/h"}, out=out, err=err)
    assert code == 2 and out.getvalue() == ""
    assert err.getvalue().startswith("error: pyproject.toml: (file): cannot be read")
    assert err.getvalue().count("\n") == 1
    (tmp_path / "pyproject.toml").write_text("[tool.metrale-orch]\n")
    env = {"HOME": "/h", "METRALE_ORCH_BUILD_DIR": "kernels"}
    err = io.StringIO()
    code = main(["--root", str(tmp_path), "check"], environ=env, out=io.StringIO(), err=err)
    assert code == 2
    assert err.getvalue().startswith(
        "error: environment METRALE_ORCH_BUILD_DIR: build_dir: 'kernels'"
    )
