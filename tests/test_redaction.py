"""The one redactor (core/redact.py ``Redactor``) and where its secrets come from
(core/secretvalues.py): JSON, Python and YAML pairs by key, values compiled once per run (a
trie past 64 values), provisioned files read with limits, names redacted like commands."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from gpuswarm.config.load import load_command_list, load_config
from gpuswarm.core import redact
from gpuswarm.core.errors import ConfigError
from gpuswarm.core.events import Ev
from gpuswarm.core.redact import REDACTED, Redactor, name_redactor, redact_shapes
from gpuswarm.core.secretvalues import (
    FILE_MAX,
    provision_sources,
    provisioned_values,
    run_redactor,
    values_in_text,
)
from gpuswarm.store.ledger import Ledger


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ('{"token": "abc123", "n": 1}', '{"token": "***", "n": 1}'),
        ('{"api_key":"k-9","password": "p\\"w"}', '{"api_key":"***","password": "***"}'),
        ("{'token': 'abc123', 'name': 'x'}", "{'token': '***', 'name': 'x'}"),
        ('{"client_secret": 12ab}', '{"client_secret": ***}'),
        ("token: abcdef", "token: ***"),
        ("password: my pass phrase  # note", "password: ***  # note"),
        ("  - api_key: 'q1w2'", "  - api_key: '***'"),
        ("INFO your token: zz99 was used", "INFO your token: *** was used"),
    ],
)
def test_json_python_and_yaml_pairs_by_key(text: str, shown: str) -> None:
    assert redact_shapes(text) == shown


@pytest.mark.parametrize(
    "text",
    [
        '{"tokens_used": 12, "max_tokens": 512, "token_count": 5, "auth": true}',
        "Tokenizer: bert-base",
        "time: 12:30:00",
        "name: ok",
        "Authorization: Bearer ***",
        '"password": "***"',
    ],
)
def test_pairs_that_hold_no_secret_are_kept(text: str) -> None:
    assert redact_shapes(text) == text


def test_values_then_shapes_and_trees() -> None:
    r = Redactor(["s3cr3t-value", "abc", "true"])  # under 4 characters and flags: no secrets
    assert r.values == frozenset({"s3cr3t-value"})
    assert r.text("x s3cr3t-value y --token zz abc true") == "x *** y --token *** abc true"
    assert r.command(["run", "--key=s3cr3t-value", "s3cr3t-value"]) == ["run", "--key=***", "***"]
    tree = {"api_key": "plain", "n": 1, "note": "has s3cr3t-value", "env": {"HF_TOKEN": "x"}}
    assert r.tree(tree) == {
        "api_key": REDACTED,
        "n": 1,
        "note": "has ***",
        "env": {"HF_TOKEN": REDACTED},
    }
    assert r.tree({"s3cr3t-value": 1}) == {"***": 1}  # a result key is shown too


def test_including_adds_a_tasks_env_and_compiles_once() -> None:
    base = Redactor.of_env({"SUPERVISOR_TOKEN": "sup-value-1", "PATH": "/usr/bin"})
    assert base.including({"PATH": "/bin"}) is base  # nothing secret: the same redactor
    assert base.including({"HF_TOKEN": "sup-value-1"}) is base  # nothing new
    redact._secret_pattern.cache_clear()
    tasks = [base.including({"MY_API_KEY": "task-value-2"}) for _ in range(2000)]
    assert redact._secret_pattern.cache_info().misses == 1  # one pattern for 2,000 tasks
    assert tasks[0].text("sup-value-1 task-value-2") == "*** ***"


def test_many_values_use_one_trie_that_prefers_the_longest() -> None:
    values = [f"secret-{i:04d}-{'x' * (i % 7)}" for i in range(300)] + ["abcd", "abcdef"]
    r = Redactor(values)
    assert len(r.values) > redact.ALTERNATION_MAX
    text = " ".join(values) + " abcdefg keep-this"
    assert r.text(text) == " ".join([REDACTED] * len(values)) + " ***g keep-this"


def test_values_in_provisioned_files() -> None:
    doc = {"oauth": {"access_token": "tok-1234", "expires": 3600}, "user": "bob", "id": 7}
    assert values_in_text(json.dumps(doc)) == {"tok-1234"}
    assert values_in_text("hf_abcdefghijklmnop\n") == {"hf_abcdefghijklmnop"}  # a token file
    dotenv = "export API_KEY='k-1234'\nPATH=/bin\npassword: pw-5678\nuser = bob\n"
    assert values_in_text(dotenv) == {"k-1234", "pw-5678"}
    assert values_in_text("[1, 2") == set()  # not JSON, no pairs
    netrc = "machine api.example.com\n  login bob\n  password nrc-2468\n"
    netrc += "default login x password d-1357\n"
    assert values_in_text(netrc) == {"nrc-2468", "d-1357"}


def test_provisioned_files_are_read_with_limits(tmp_path: Path) -> None:
    folder = tmp_path / "login"
    (folder / "sub").mkdir(parents=True)
    (folder / "auth.json").write_text('{"token": "in-folder-1234"}')
    (folder / "sub" / "creds").write_text("secret_key = nested-5678\n")
    (folder / "big.json").write_text('{"token": "too-big-0000"}' + " " * FILE_MAX)
    outside = tmp_path / "other-user-key"
    outside.write_text("not-provisioned-9999")
    (folder / "link").symlink_to(outside)  # a link is not followed
    os.mkfifo(folder / "fifo")  # never blocks
    assert provisioned_values([folder, tmp_path / "missing"]) == {"in-folder-1234", "nested-5678"}


def test_run_redactor_takes_this_process_and_the_provisions(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "cred.json").write_text('{"refresh_token": "prov-4321"}')
    monkeypatch.setenv("SUPERVISOR_TOKEN", "sup-8765")
    info = {"base_dir": str(tmp_path), "home": {"provision": [{"src": "cred.json", "dest": "x"}]}}
    assert provision_sources(info, base=str(tmp_path)) == [tmp_path / "cred.json"]
    r = run_redactor(info, {"OWN_SECRET": "own-1111"})
    assert r.text("prov-4321 sup-8765 own-1111 fine") == "*** *** *** fine"
    config = {
        "defaults": {"env": {"DB_PASSWORD": "cfg-2222"}},
        "tasks": [{"command": "x cfg-2222"}],
    }
    assert run_redactor(config=config).tree(config)["tasks"] == [{"command": "x ***"}]


def test_names_are_redacted_like_commands_at_load(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SUPERVISOR_TOKEN", "sup-name-value")
    assert (
        name_redactor({"MY_API_KEY": "own-name-value"}).name(
            "train sup-name-value own-name-value --token zz"
        )
        == "train *** *** --token ***"
    )
    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        "defaults: {env: {MY_API_KEY: own-name-value}}\n"
        "tasks:\n  - {name: 'a-sup-name-value', command: 'true'}\n"
        "  - {name: 'b-own-name-value', command: 'true'}\n"
        "  - {name: 'c {\"token\": \"json-in-name\"}', command: 'true'}\n"
    )
    tasks = load_config(cfg).tasks
    assert [t.name for t in tasks] == ["a-***", "b-***", 'c {"token": "***"}']
    assert all("value" not in t.id and "json-in-name" not in t.id for t in tasks)
    lines = load_command_list(None, "echo sup-name-value\n", shell=False, base_dir=tmp_path).tasks
    assert lines[0].name == "echo ***" and lines[0].command == ["echo", "sup-name-value"]


def test_a_group_name_holding_a_secret_is_refused_and_a_default_one_loses_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A group is matched by name (groups:, group:NAME, --group) and shown everywhere
    (report.html, the dashboard, /metrics' labels): one holding a secret is exit 2 at its
    field; a glob or matrix entry's default group is made from its redacted name."""
    monkeypatch.setenv("SUPERVISOR_TOKEN", "sup-group-value")
    cfg = tmp_path / "c.yaml"
    for text, where in (
        (
            "defaults: {env: {MY_API_KEY: own-group-value}}\n"
            "tasks: [{command: 'true', group: g-own-group-value}]\n",
            "c.yaml:2: tasks[0].group: group 'g-***' holds a secret",
        ),
        (
            "tasks: [{command: 'true', group: g-sup-group-value}]\n",
            "c.yaml:1: tasks[0].group: group 'g-***' holds a secret",
        ),
        (
            "groups: {g-sup-group-value: {max_parallel: 1}}\ntasks: [{command: 'true'}]\n",
            "c.yaml:1: groups: group 'g-***' holds a secret",
        ),
    ):
        cfg.write_text(text)
        with pytest.raises(ConfigError) as exc:
            load_config(cfg)
        assert where in str(exc.value), str(exc.value)
        assert "group-value" not in str(exc.value)  # not even in the message
    cfg.write_text("tasks: [{name: 'ev-sup-group-value-{i}', matrix: {i: [1, 2]}, command: x}]\n")
    assert {t.group for t in load_config(cfg).tasks} == {"ev"}


def test_a_supervisors_journal_redacts_reasons_and_names(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "events.jsonl", redact=Redactor(["leaked-4242"]).text)
    ledger.emit(Ev.FINISHED, task="t", slot="s", reason='exit 0 but {"token": "x1"} leaked-4242')
    ledger.emit(Ev.STARTED, task="t", attempt=1, slot="s", name="n leaked-4242")
    ledger.close()
    text = (tmp_path / "events.jsonl").read_text()
    assert "leaked-4242" not in text and "x1" not in text and text.count(REDACTED) == 3


def test_a_journal_redacts_a_recurring_text_every_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The ledger remembers what it redacted (the same reasons recur): every line is still
    redacted, each text redacted once, and what it keeps is bounded."""
    from gpuswarm.store import ledger as ledger_module

    monkeypatch.setattr(ledger_module, "_REDACTED_KEPT", 2)
    calls: list[str] = []
    redactor = Redactor(["leaked-4242"])

    def counted(text: str) -> str:
        calls.append(text)
        return redactor.text(text)

    ledger = Ledger(tmp_path / "events.jsonl", redact=counted)
    for i in range(3):
        ledger.emit(Ev.FINISHED, task=f"t{i}", slot="s", reason="exit 1 leaked-4242")
    for i in range(3):  # more texts than it keeps: forgotten, redacted again
        ledger.emit(Ev.STARTED, task=f"t{i}", attempt=1, slot="s", name=f"n{i} leaked-4242")
    ledger.close()
    text = (tmp_path / "events.jsonl").read_text()
    assert "leaked-4242" not in text and text.count(REDACTED) == 6
    assert calls.count("exit 1 leaked-4242") == 1
    assert len(calls) == 4
    assert len(ledger._redacted) <= 2  # bounded


def test_a_secret_cut_in_two_by_reads_is_still_redacted_line_by_line() -> None:
    from gpuswarm.core.redact import LINE_MAX, LineRedactor, Redactor

    lines = LineRedactor(Redactor(["Sup3rSecretValue99"]))
    out = lines.feed(b"token here: Sup3rSec") + lines.feed(b"retValue99 and more\nnext \xff")
    assert out == b"token here: *** and more\n"  # the last line waits for its end
    assert lines.flush() == b"next \xff"  # bytes that are not UTF-8 pass as they are
    assert lines.feed(b"x" * (LINE_MAX + 1)) == b"x" * (LINE_MAX + 1)  # no line holds forever
    assert lines.feed(b"progress 10%\rprogress 20%\r") == b"progress 10%\rprogress 20%\r"
