"""scripts/llama_server.py without building: where the venv lives, and that only a venv whose ready marker
(written last) names an existing GGUF counts as built."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "llama_server.py"


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("llama_server_script_under_test", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


LLAMA = _script()


def test_the_venv_lives_in_the_cache_outside_the_clone(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("REEL_LLAMA_VENV", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert LLAMA.venv_dir() == tmp_path / "cache" / "reel" / "llama-cpp-python-0.3.16"
    assert LLAMA.log_path(LLAMA.venv_dir()) == tmp_path / "cache" / "reel" / "llama-cpp-python-0.3.16.build.log"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert LLAMA.venv_dir() == Path.home() / ".cache" / "reel" / "llama-cpp-python-0.3.16"
    monkeypatch.setenv("REEL_LLAMA_VENV", str(tmp_path / "mine"))
    assert LLAMA.venv_dir() == tmp_path / "mine"


def test_only_a_venv_with_its_marker_naming_an_existing_gguf_is_ready(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    assert LLAMA.ready(venv) is None  # missing
    (venv / "bin").mkdir(parents=True)
    assert LLAMA.ready(venv) is None  # half-built: no marker
    gguf = tmp_path / LLAMA.GGUF_NAME
    (venv / ".reel-ready.tmp").write_text(json.dumps({"gguf": str(gguf)}))
    assert LLAMA.ready(venv) is None  # the marker not yet moved into place
    (venv / ".reel-ready").write_text("{trunc")
    assert LLAMA.ready(venv) is None  # unreadable
    (venv / ".reel-ready").write_text(json.dumps({"gguf": str(gguf)}))
    assert LLAMA.ready(venv) is None  # names a GGUF that is not there
    with pytest.raises(FileNotFoundError, match=r"scripts/llama_server\.py build"):
        LLAMA.gguf_path(venv)
    gguf.write_bytes(b"GGUF")
    assert LLAMA.ready(venv) == {"gguf": str(gguf)} and LLAMA.gguf_path(venv) == gguf
    argv = LLAMA.server_argv(venv, 0)
    assert argv[:3] == [str(venv / "bin" / "python"), "-m", "llama_cpp.server"]
    assert argv[argv.index("--chat_format") + 1] == "chatml-function-calling"
    assert (argv[argv.index("--host") + 1], argv[argv.index("--port") + 1]) == ("127.0.0.1", "0")


def test_status_says_not_ready_with_exit_1(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("REEL_LLAMA_VENV", str(tmp_path / "none"))
    assert LLAMA.main(["status"]) == 1
    out = json.loads(capsys.readouterr().out)
    assert out == {"venv": str(tmp_path / "none"), "ready": False, "gguf": None,
                   "log": str(tmp_path / "none.build.log")}
