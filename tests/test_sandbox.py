"""Tests for gpuswarm.exec.sandbox: slot HOME layout, private writable provisioned copies,
redaction."""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
import traceback
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from gpuswarm.core.errors import EXIT_BAD_INPUT, ConfigError
from gpuswarm.core.redact import is_secret_name, redact_env, redact_text
from gpuswarm.exec.sandbox import (
    CACHE_DIRS,
    CACHE_VARS,
    Provision,
    check_provision_dest,
    prepare_home,
)

NOBODY = 65534


def mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def tree(root: Path) -> dict[str, tuple[str, int]]:
    """relative path -> (kind, mode) of everything under ``root``, without following links."""
    out: dict[str, tuple[str, int]] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = Path(dirpath) / name
            st = os.lstat(path)
            kind = "link" if stat.S_ISLNK(st.st_mode) else "dir" if path.is_dir() else "file"
            out[str(path.relative_to(root))] = (kind, stat.S_IMODE(st.st_mode))
    return out


@pytest.fixture
def host(tmp_path: Path) -> Path:
    """A fake host HOME with a credential file and a credential folder full of odd entries."""
    root = tmp_path / "host"
    (root / ".codex").mkdir(parents=True)
    (root / ".codex" / "auth.json").write_text('{"token": "sk-original"}')
    gcloud = root / ".config" / "gcloud"
    (gcloud / "configurations").mkdir(parents=True)
    (gcloud / "credentials.db").write_bytes(b"\x00db")
    (gcloud / "configurations" / "config_default").write_text("[core]\naccount = me\n")
    outside = tmp_path / "outside"
    (outside / "private").mkdir(parents=True)
    (outside / "private" / "id_rsa").write_text("PRIVATE KEY")
    (gcloud / "shared.txt").write_text("shared")
    (gcloud / "link_to_file").symlink_to("shared.txt")  # links inside the provisioned folder
    (gcloud / "link_to_dir").symlink_to(gcloud / "configurations")
    (gcloud / "dangling").symlink_to(outside / "missing")
    os.mkfifo(gcloud / "fifo")
    return root


def provisions(host: Path) -> list[Provision]:
    return [
        Provision(host / ".codex" / "auth.json", ".codex/auth.json"),
        Provision(host / ".config" / "gcloud", ".config/gcloud"),
    ]


def as_unprivileged(fn: Callable[[], None]) -> None:
    """Run ``fn`` as a non-root user (fork + setuid when root) so permission bits are enforced."""
    if os.geteuid() != 0:
        fn()
        return
    read_end, write_end = os.pipe()
    with warnings.catch_warnings():  # 3.12+ warns if other tests left threads; the child only
        warnings.simplefilter("ignore", DeprecationWarning)  # does file work, then _exit()s
        pid = os.fork()
    if pid == 0:  # child: never returns into pytest
        code = 0
        try:
            os.close(read_end)
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            fn()
        except BaseException:
            os.write(write_end, traceback.format_exc().encode())
            code = 1
        finally:
            os._exit(code)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as fh:
        report = fh.read().decode()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, report


@pytest.fixture
def shared_tmp() -> Iterator[Path]:
    """A folder a non-root user can use (pytest's tmp_path lives under a 0700 folder)."""
    path = Path(tempfile.mkdtemp(prefix="gpuswarm-test-"))
    if os.geteuid() == 0:
        os.chown(path, NOBODY, NOBODY)
    try:
        yield path
    finally:
        for dirpath, dirnames, _ in os.walk(path):
            for name in dirnames:
                (Path(dirpath) / name).chmod(0o700)
        shutil.rmtree(path)


# -- layout and modes
def test_home_and_cache_folders(tmp_path: Path) -> None:
    home = tmp_path / "run" / "homes" / "slot-0"
    env = prepare_home(home, [])
    assert set(env) == {"HOME", *CACHE_VARS}
    assert env["HOME"] == str(home)
    assert env["TORCH_EXTENSIONS_DIR"] == str(home / ".cache" / "torch_extensions")
    assert env["TRITON_CACHE_DIR"] == str(home / ".triton" / "cache")
    assert env["TMPDIR"] == str(home / "tmp")
    assert env["CODEX_HOME"] == str(home / ".codex")
    assert env["MIOPEN_USER_DB_PATH"] == str(home / ".config" / "miopen")
    assert env["CUDA_CACHE_PATH"] == str(home / ".nv" / "ComputeCache")
    for var in CACHE_VARS:
        path = Path(env[var])
        assert path.is_dir() and not path.is_symlink(), var
        assert path.is_relative_to(home), var
    assert mode(home) == 0o700


def test_cache_vars_cover_the_documented_set() -> None:
    expected = {
        "XDG_CACHE_HOME",
        "TORCH_EXTENSIONS_DIR",
        "TRITON_CACHE_DIR",
        "MIOPEN_USER_DB_PATH",
        "MIOPEN_CUSTOM_CACHE_DIR",
        "MPLCONFIGDIR",
        "CUDA_CACHE_PATH",
        "TMPDIR",
        "XDG_CONFIG_HOME",
        "XDG_DATA_HOME",
        "CODEX_HOME",
    }
    assert set(CACHE_VARS) == expected == set(CACHE_DIRS)


def test_existing_home_is_chmodded_to_0700(tmp_path: Path) -> None:
    home = tmp_path / "slot-0"
    home.mkdir(mode=0o755)
    home.chmod(0o755)
    prepare_home(home, [])
    assert mode(home) == 0o700


def test_relative_home_gives_absolute_paths(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    env = prepare_home(Path("slot-1"), [])
    assert env["HOME"] == str(tmp_path / "slot-1")
    assert all(Path(v).is_absolute() for v in env.values())


def test_symlinked_home_is_refused(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "slot-0").symlink_to(real)
    with pytest.raises(ConfigError, match="is a symlink"):
        prepare_home(tmp_path / "slot-0", [])
    assert list(real.iterdir()) == []


def test_home_that_is_a_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "slot-0").write_text("x")
    with pytest.raises(ConfigError, match="is not a folder"):
        prepare_home(tmp_path / "slot-0", [])


# -- provisioned copies
def test_file_copy_is_private_and_independent(tmp_path: Path, host: Path) -> None:
    home = tmp_path / "slot-0"
    prepare_home(home, provisions(host))
    original = host / ".codex" / "auth.json"
    copy = home / ".codex" / "auth.json"
    assert copy.read_text() == '{"token": "sk-original"}'
    assert not copy.is_symlink()
    assert copy.stat().st_ino != original.stat().st_ino
    assert mode(copy) == 0o600  # private, writable: agents refresh their tokens
    assert mode(home / ".codex") == 0o700  # CODEX_HOME itself stays writable
    original.write_text("changed later")
    assert copy.read_text() == '{"token": "sk-original"}'


def test_folder_copy_modes_and_symlink_rules(tmp_path: Path, host: Path) -> None:
    home = tmp_path / "slot-0"
    prepare_home(home, provisions(host))
    copy = home / ".config" / "gcloud"
    assert tree(copy) == {
        "configurations": ("dir", 0o700),
        "configurations/config_default": ("file", 0o600),
        "credentials.db": ("file", 0o600),
        "shared.txt": ("file", 0o600),
        "link_to_file": ("file", 0o600),  # copied as the regular file it points to
    }  # link_to_dir, dangling and fifo are skipped
    assert mode(copy) == 0o700
    assert (copy / "credentials.db").read_bytes() == b"\x00db"
    assert (copy / "link_to_file").read_text() == "shared"
    assert not (home / ".config" / "gcloud" / "link_to_dir").exists()
    assert "id_rsa" not in str(tree(home))


def test_top_level_symlink_source_is_followed(tmp_path: Path, host: Path) -> None:
    link = tmp_path / "codex-link"
    link.symlink_to(host / ".codex")
    prepare_home(tmp_path / "slot-0", [Provision(link, ".codex/state")])
    assert tree(tmp_path / "slot-0" / ".codex" / "state") == {"auth.json": ("file", 0o600)}


def test_reprovision_replaces_copies(tmp_path: Path, host: Path) -> None:
    home = tmp_path / "slot-0"
    prepare_home(home, provisions(host))
    (host / ".codex" / "auth.json").write_text("new token")
    (host / ".config" / "gcloud" / "credentials.db").unlink()
    (host / ".config" / "gcloud" / "added").write_text("added")
    env = prepare_home(home, provisions(host))
    assert (home / ".codex" / "auth.json").read_text() == "new token"
    assert mode(home / ".codex" / "auth.json") == 0o600
    assert set(tree(home / ".config" / "gcloud")) == {
        "configurations",
        "configurations/config_default",
        "added",
        "shared.txt",
        "link_to_file",
    }
    assert mode(home / ".config" / "gcloud") == 0o700
    leftovers = [p for p in tree(home) if Path(p).name.startswith((".tmp-", ".old-"))]
    assert leftovers == []
    assert env["HOME"] == str(home)


def test_reprovision_cleans_leftovers_of_an_interrupted_copy(tmp_path: Path, host: Path) -> None:
    home = tmp_path / "slot-0"
    prepare_home(home, provisions(host))
    stale = home / ".config" / ".tmp-gcloud.99999"
    stale.mkdir()
    (stale / "half").write_text("half")
    stale.chmod(0o500)
    (home / ".codex" / ".tmp-auth.json.99999").write_text("half")
    prepare_home(home, provisions(host))
    assert not stale.exists()
    assert sorted(p.name for p in (home / ".codex").iterdir()) == ["auth.json"]


def test_provision_kind_can_change_between_runs(tmp_path: Path, host: Path) -> None:
    home = tmp_path / "slot-0"
    prepare_home(home, [Provision(host / ".config" / "gcloud", ".codex/thing")])
    prepare_home(home, [Provision(host / ".codex" / "auth.json", ".codex/thing")])
    assert (home / ".codex" / "thing").read_text() == '{"token": "sk-original"}'
    prepare_home(home, [Provision(host / ".config" / "gcloud", ".codex/thing")])
    assert (home / ".codex" / "thing").is_dir()


def test_copies_are_writable_by_a_normal_user_and_the_source_stays(shared_tmp: Path) -> None:
    def body() -> None:
        src = shared_tmp / "src"
        (src / "dir" / "sub").mkdir(parents=True)
        (src / "dir" / "sub" / "f").write_text("one")
        (src / "auth.json").write_text("secret-1")
        provs = [Provision(src / "auth.json", ".codex/auth.json"), Provision(src / "dir", "d")]
        home = shared_tmp / "slot-0"
        prepare_home(home, provs)
        with (home / ".codex" / "auth.json").open("a") as fh:  # an agent refreshing its token
            fh.write("-refreshed")
        (home / "d" / "sub" / "new").write_text("x")
        (home / "d" / "sub" / "f").write_text("rewritten")
        assert (src / "auth.json").read_text() == "secret-1"  # the source is never written
        assert (src / "dir" / "sub" / "f").read_text() == "one"
        assert not (src / "dir" / "sub" / "new").exists()
        (src / "auth.json").write_text("secret-2")
        prepare_home(home, provs)  # a new supervisor provisions afresh from the source
        assert (home / ".codex" / "auth.json").read_text() == "secret-2"
        assert (home / "d" / "sub" / "f").read_text() == "one"
        assert not (home / "d" / "sub" / "new").exists()

    as_unprivileged(body)


def test_unreadable_source_file_is_a_config_error(shared_tmp: Path) -> None:
    secret = shared_tmp / "secret"
    secret.write_text("x")
    secret.chmod(0o000)
    if os.geteuid() == 0:
        os.chown(secret, NOBODY, NOBODY)  # the user's own file, unreadable by its mode

    def body() -> None:
        with pytest.raises(ConfigError, match="cannot read provision file"):
            prepare_home(shared_tmp / "slot-0", [Provision(secret, "s")])

    as_unprivileged(body)


def test_symlink_left_in_home_is_not_followed(tmp_path: Path, host: Path) -> None:
    home = tmp_path / "slot-0"
    prepare_home(home, provisions(host))
    victim = tmp_path / "victim"
    victim.mkdir()
    shutil.rmtree(home / ".codex")
    (home / ".codex").symlink_to(victim)  # a task replaced CODEX_HOME by a link
    (home / ".cache").unlink() if (home / ".cache").is_symlink() else shutil.rmtree(home / ".cache")
    (home / ".cache").symlink_to(victim)
    env = prepare_home(home, provisions(host))
    assert list(victim.iterdir()) == []
    assert not (home / ".codex").is_symlink() and (home / ".codex" / "auth.json").is_file()
    assert not Path(env["XDG_CACHE_HOME"]).is_symlink()


# -- refusals
@pytest.mark.parametrize(
    ("dest", "expected"),
    [
        ("../x", "without '..'"),
        ("a/../../x", "without '..'"),
        ("a/..", "without '..'"),
        ("/etc/x", "must be relative to the slot HOME: write 'etc/x'"),
        ("~/.codex/auth.json", "write '.codex/auth.json', not '~/.codex/auth.json'"),
        ("", "give a path relative"),
        (".", "without '..'"),
        ("./", "without '..'"),
        ("a\0b", "give a path relative"),
        (".cache", "would replace the XDG_CACHE_HOME folder ~/.cache"),
        (".config", "the slot's own cache"),
        (".triton", "TRITON_CACHE_DIR"),
        ("tmp", "TMPDIR"),
        (".codex", "CODEX_HOME"),
    ],
)
def test_bad_dests_are_refused(dest: str, expected: str) -> None:
    with pytest.raises(ConfigError) as info:
        check_provision_dest(dest)
    assert expected in str(info.value)
    assert info.value.exit_code == EXIT_BAD_INPUT


@pytest.mark.parametrize(
    ("dest", "norm"),
    [
        (".codex/auth.json", ".codex/auth.json"),
        ("./.codex//auth.json", ".codex/auth.json"),
        (".config/gcloud/", ".config/gcloud"),
        (".cache/huggingface/token", ".cache/huggingface/token"),
        ("..hidden", "..hidden"),
    ],
)
def test_good_dests_are_normalised(dest: str, norm: str) -> None:
    assert check_provision_dest(dest) == norm


def test_bad_provisions_are_refused_before_anything_is_written(tmp_path: Path, host: Path) -> None:
    home = tmp_path / "slot-0"
    auth = host / ".codex" / "auth.json"
    cases: list[tuple[list[Provision], str]] = [
        ([Provision(auth, "../escape")], "without '..'"),
        ([Provision(auth, "/etc/x")], "relative to the slot HOME"),
        ([Provision(Path("relative/auth.json"), "a")], "must be an absolute path"),
        ([Provision(host / "missing", "a")], "does not exist"),
        ([Provision(auth, "a/b"), Provision(auth, "a")], "overlap"),
        ([Provision(auth, "a"), Provision(auth, "./a")], "overlap"),
    ]
    for provs, expected in cases:
        with pytest.raises(ConfigError, match=expected):
            prepare_home(home, provs)
        assert not home.exists()
    assert not (tmp_path / "escape").exists()


def test_special_file_source_is_refused(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(ConfigError, match="neither a regular file nor a folder"):
        prepare_home(tmp_path / "slot-0", [Provision(fifo, "f")])


# -- redaction
@pytest.mark.parametrize(
    "name",
    [
        "HF_TOKEN",
        "GITHUB_TOKEN",
        "hf_token",
        "OPENAI_API_KEY",
        "STRIPE_APIKEY",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_ACCESS_KEY_ID",
        "DB_PASSWORD",
        "MYSQL_PASSWD",
        "SSH_PASSPHRASE",
        "GPG_PRIVATE_KEY",
        "GOOGLE_APPLICATION_CREDENTIALS",
        "AUTH",
        "GH_AUTH",
        "HTTP_AUTHORIZATION",
        "OAUTH_CLIENT_ID",
        "BROWSER_COOKIE",
        "FLASK_SESSION_KEY",
        "CLIENT_SECRET",
        "OPENAI_KEY",
        "KEY",
    ],
)
def test_secret_names(name: str) -> None:
    assert is_secret_name(name)


@pytest.mark.parametrize(
    "name",
    [
        "GIT_AUTHOR_NAME",
        "GIT_AUTHOR_EMAIL",
        "CERT_AUTHORITY",
        "TOKENIZERS_PARALLELISM",
        "MAX_TOKENS",
        "PATH",
        "HOME",
        "CUDA_VISIBLE_DEVICES",
        "KEYBOARD_LAYOUT",
        "MONKEY",
        "SESSION_ID",
    ],
)
def test_not_secret_names(name: str) -> None:
    assert not is_secret_name(name)


def test_redact_env() -> None:
    env = {"HF_TOKEN": "hf_abc", "PATH": "/usr/bin", "DB_PASSWORD": "", "Api_Key": "k"}
    assert redact_env(env) == {
        "HF_TOKEN": "***",
        "PATH": "/usr/bin",
        "DB_PASSWORD": "",
        "Api_Key": "***",
    }
    assert env["HF_TOKEN"] == "hf_abc"  # the input is not modified


def test_redact_text_replaces_every_occurrence() -> None:
    env = {"HF_TOKEN": "hf_abc123", "PATH": "/usr/bin", "PIN_PASSWORD": "123"}
    text = "using hf_abc123 from /usr/bin; again hf_abc123! pin 123"
    assert redact_text(text, env) == "using *** from /usr/bin; again ***! pin 123"


def test_redact_text_longest_secret_first_and_special_characters() -> None:
    env = {"A_TOKEN": "abcd", "B_TOKEN": "abcdefgh", "C_SECRET": "a.b*c(d)"}
    text = "abcdefgh abcd a.b*c(d) aXbbc(d)"
    assert redact_text(text, env) == "*** *** *** aXbbc(d)"  # not "***efgh" for the long one


def test_redact_text_strips_whitespace_around_values() -> None:
    env = {"GITHUB_TOKEN": "ghp_0123456789\n"}
    assert redact_text("token=ghp_0123456789 ok", env) == "token=*** ok"


def test_redact_text_leaves_flag_values_alone() -> None:
    env = {"ENABLE_AUTH": "true", "USE_TOKEN": "False", "OPENAI_API_KEY": "sk-123456"}
    text = "auth=true token=False key=sk-123456"
    assert redact_text(text, env) == "auth=true token=False key=***"
    assert redact_env(env)["ENABLE_AUTH"] == "***"  # the env view still hides it


def test_redact_text_without_secrets_is_unchanged() -> None:
    text = "nothing to hide"
    assert redact_text(text, {"PATH": "nothing"}) == text
    assert redact_text(text, {}) == text


# -- issue 30: nothing from outside the provisioned tree, nothing of another user
@pytest.mark.parametrize("target", ["private/id_rsa", "private"])
def test_a_link_out_of_a_provisioned_folder_refuses_it_naming_the_link(
    tmp_path: Path, host: Path, target: str
) -> None:
    gcloud = host / ".config" / "gcloud"
    (gcloud / "configurations" / "key").symlink_to(tmp_path / "outside" / target)
    home = tmp_path / "slot-0"
    with pytest.raises(ConfigError) as err:
        prepare_home(home, provisions(host))
    text = str(err.value)
    assert str(gcloud / "configurations" / "key") in text
    assert str(tmp_path / "outside" / target) in text and "outside the provisioned" in text
    assert err.value.exit_code == EXIT_BAD_INPUT
    assert "PRIVATE KEY" not in str(tree(home))
    assert not (home / ".config" / "gcloud").exists()
    assert [p for p in tree(home) if ".tmp-" in p] == []  # no half-made copy left


def test_a_link_to_a_system_file_is_refused(tmp_path: Path, host: Path) -> None:
    (host / ".config" / "gcloud" / "shadow").symlink_to("/etc/passwd")
    with pytest.raises(ConfigError, match="/etc/passwd, outside the provisioned folder"):
        prepare_home(tmp_path / "slot-0", provisions(host))


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another user needs root")
@pytest.mark.parametrize("which", ["file", "in_folder"])
def test_a_file_of_another_user_is_refused_naming_it(
    tmp_path: Path, host: Path, which: str
) -> None:
    """Root reads anyone's files whatever their modes: owning them is what is checked."""
    gcloud = host / ".config" / "gcloud"
    theirs = host / ".codex" / "auth.json" if which == "file" else gcloud / "credentials.db"
    os.chown(theirs, NOBODY, NOBODY)
    home = tmp_path / "slot-0"
    with pytest.raises(ConfigError, match="not to you") as err:
        prepare_home(home, provisions(host))
    assert str(theirs) in str(err.value) and f"uid {NOBODY}" in str(err.value)
    assert not (home / ".codex" / "auth.json").exists()
