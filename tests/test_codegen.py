"""The generated module is current, deterministic, and marked as generated."""

import os
import subprocess
import sys

from derivations import codegen


def test_generated_module_is_current():
    ok, message = codegen.check()
    assert ok, message


def test_generation_is_byte_reproducible_across_hash_seeds():
    # a fresh interpreter with another hash seed must produce the same bytes
    env = dict(os.environ, PYTHONHASHSEED="12345")
    result = subprocess.run([sys.executable, "-m", "derivations", "--check"], env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_check_detects_a_stale_file(tmp_path):
    stale = tmp_path / "_generated.py"
    stale.write_text(codegen.generate_source().replace("jax.nn.softmax", "jax.nn.log_softmax", 1))
    ok, message = codegen.check(stale)
    assert not ok and "stale" in message


def test_marked_generated():
    assert codegen.GENERATED_PATH.read_text().startswith("# GENERATED FILE: DO NOT EDIT.")
