"""The command line: files in, files out (atomically), typed errors on bad input."""

import json
from pathlib import Path

import numpy as np
import pytest

from solver import planted_instance
from unmask.cli import main


@pytest.fixture(scope="module")
def instance_files(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("inst")
    problem, X = planted_instance(3, 6, 2, seed=4)
    np.save(tmp / "W.npy", problem.W)
    np.save(tmp / "B.npy", problem.B)
    return tmp, problem, X


def test_recover_writes_x_and_certificate(instance_files, capsys):
    tmp, problem, X = instance_files
    rc = main(["recover", "--W", str(tmp / "W.npy"), "--B", str(tmp / "B.npy"), "--out", str(tmp / "X.npy"),
               "--certificate", str(tmp / "cert.json")])
    assert rc == 0
    cert = json.loads((tmp / "cert.json").read_text())
    assert cert["status"] == "certified" and cert["fingerprint"] == problem.fingerprint()
    assert cert["symmetry_dimension"] == 0 and cert["error_bound"] > 0
    Xr = np.load(tmp / "X.npy")
    assert Xr.shape == X.shape
    assert not list(tmp.glob("*.part"))  # nothing half-written left behind
    out, err = capsys.readouterr()  # progress lines, timed, on stderr
    assert "fit: it reproduces B to a relative residual of" in out
    assert "closed-form start" in err and "local Newton certificate holds" in err and " s] " in err
    main(["recover", "--W", str(tmp / "W.npy"), "--B", str(tmp / "B.npy"), "--out", str(tmp / "X.npy"), "--quiet"])
    assert capsys.readouterr().err == ""


def test_recover_output_variant_writes_a_kantorovich_certificate(tmp_path, capsys):
    # seed 2: the local Newton certificate fails by far (lambda_min^2 / (4 M ||grad||) = 5e-7 at the
    # root, against 1 needed) and Kantorovich's test proves the root. Seed 4, used before, sat on the
    # edge (1.24 on one machine, below 1 on another: rounding decided which certificate was issued)
    problem, X = planted_instance(4, 8, 1, variant="output", seed=2)
    np.save(tmp_path / "W.npy", problem.W)
    np.save(tmp_path / "O.npy", problem.B)
    np.save(tmp_path / "Wv.npy", problem.W_V)
    rc = main(["recover", "--W", str(tmp_path / "W.npy"), "--B", str(tmp_path / "O.npy"), "--W-V",
               str(tmp_path / "Wv.npy"), "--out", str(tmp_path / "X.npy"), "--certificate", str(tmp_path / "c.json")])
    assert rc == 0
    cert = json.loads((tmp_path / "c.json").read_text())
    assert cert["status"] == "certified" and cert["kind"] == "kantorovich-root"
    assert cert["fingerprint"] == problem.fingerprint() and cert["error_bound"] < 1e-9
    out = capsys.readouterr()
    assert "Kantorovich" in out.out and "Kantorovich root test: an exact root is proved" in out.err
    rc = main(["recover", "--W", str(tmp_path / "W.npy"), "--B", str(tmp_path / "O.npy"), "--W-V",
               str(tmp_path / "Wv.npy"), "--out", str(tmp_path / "X0.npy"), "--restarts", "0"])
    assert rc == 2 and "restarts must be an integer >= 1" in capsys.readouterr().err and not (tmp_path / "X0.npy").exists()


def test_recover_reports_the_residual_of_a_b_that_no_x_produces(instance_files, capsys):
    """Random stochastic maps (no X makes them): whatever certificate the minimiser gets, the
    command's output gives the residual and says that X does not reproduce B."""
    tmp, problem, _ = instance_files
    rng = np.random.default_rng(3)
    B = rng.random(np.shape(problem.B)) + 0.1
    np.save(tmp / "Brand.npy", B / B.sum(axis=-1, keepdims=True))
    rc = main(["recover", "--W", str(tmp / "W.npy"), "--B", str(tmp / "Brand.npy"), "--out", str(tmp / "Xr.npy"),
               "--quiet", "--no-certify"])
    out = capsys.readouterr().out
    assert rc == 0, out
    line = next(s for s in out.splitlines() if s.startswith("fit: "))
    assert "does NOT reproduce B" in line, out
    rel = float(line.split("relative residual ")[1].split()[0])
    Xr = np.load(tmp / "Xr.npy")
    from solver import Problem

    again = Problem.create(problem.W, np.load(tmp / "Brand.npy"))  # the residual, recomputed from the written X
    assert rel == pytest.approx(np.sqrt(2 * float(again.loss(Xr))) / max(1.0, np.linalg.norm(again.B)), rel=0.02)  # (printed to 2 digits)
    assert rel > 1e-3


def test_recover_bad_inputs(instance_files, capsys):
    tmp, _, _ = instance_files
    rc = main(["recover", "--W", str(tmp / "W.npy"), "--B", str(tmp / "B.npy"), "--out", str(tmp / "missing" / "X.npy")])
    assert rc == 2 and "does not exist" in capsys.readouterr().err
    (tmp / "junk.npy").write_bytes(b"not an array")
    rc = main(["recover", "--W", str(tmp / "W.npy"), "--B", str(tmp / "junk.npy"), "--out", str(tmp / "X2.npy")])
    assert rc == 2 and "junk.npy is not a .npy file" in capsys.readouterr().err
    (tmp / "cut.npy").write_bytes((tmp / "B.npy").read_bytes()[:200])  # the header, then too few bytes
    rc = main(["recover", "--W", str(tmp / "W.npy"), "--B", str(tmp / "cut.npy"), "--out", str(tmp / "X2.npy")])
    assert rc == 2 and "cannot read" in capsys.readouterr().err
    rc = main(["recover", "--W", str(tmp), "--B", str(tmp / "B.npy"), "--out", str(tmp / "X2.npy")])
    assert rc == 2 and "is a directory" in capsys.readouterr().err and not (tmp / "X2.npy").exists()
    bad = np.load(tmp / "B.npy")
    bad[0, 1, 2] += 0.3
    np.save(tmp / "bad.npy", bad)
    rc = main(["recover", "--W", str(tmp / "W.npy"), "--B", str(tmp / "bad.npy"), "--out", str(tmp / "X3.npy")])
    assert rc == 2 and "row 1 sums to" in capsys.readouterr().err
    assert not (tmp / "X2.npy").exists() and not (tmp / "X3.npy").exists()


def test_verify_region_errors(capsys):
    assert main(["verify", "--region", "d=2,n=3,R=0"]) == 2
    assert "R = 0" in capsys.readouterr().err
    assert main(["verify", "--region", "d=2,n=3,bogus=1"]) == 2
    assert "unknown key" in capsys.readouterr().err


@pytest.mark.slow
def test_verify_writes_json(tmp_path):
    out = tmp_path / "report.json"
    rc = main(["verify", "--instances", "4", "--starts", "2", "--steps", "10", "--json", str(out), "--rigorous",
               "--region", "d=2,n=4,heads=2,R=1,omega=1,mu=0.5,gamma=1,gamma_max=1"])
    data = json.loads(out.read_text())
    assert rc == 0 and data["rigorous"]["certified"]
    for row in data["lemmas"]:
        assert {"name", "status", "bound", "worst_random_ratio", "worst_adversarial_ratio"} <= set(row)
        assert row["status"] == "OK"


@pytest.mark.slow
def test_derive_show_prints_formulas_and_constants(capsys):
    assert main(["derive", "--show"]) == 0
    out = capsys.readouterr().out
    assert "gradient" in out and "hessian_lipschitz" in out and "growth" in out


def test_recover_help_states_the_solver_defaults():
    """The --restarts help spells out recover's defaults (the CLI does not import the solver to build
    its parser); this keeps the two in step."""
    import argparse

    from solver.recover import RESTARTS, SQUARE_OUTPUT_RESTARTS
    from unmask.commands.recover import add_arguments

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    text = next(a.help for a in parser._actions if a.dest == "restarts")
    assert f"default: {RESTARTS};" in text and f"{SQUARE_OUTPUT_RESTARTS} for the square" in text


@pytest.mark.parametrize("args, message", [
    (["--output-restarts", "0"], "argument --output-restarts: expected an integer >= 1, got 0"),
    (["--instances", "-3"], "argument --instances: expected an integer >= 1, got -3"),
    (["--seed-start", "x"], "argument --seed-start: expected an integer >= 0, got 'x'"),
    (["--seeds", "1,-2"], "--seeds takes non-negative integers"),
])
def test_benchmark_counts_are_checked_before_any_run(args, message):
    """A bad count is a usage error (exit 2, what is wrong), not a traceback after minutes of runs."""
    import pathlib
    import subprocess
    import sys

    script = pathlib.Path(__file__).resolve().parents[1] / "benchmarks" / "recover_bench.py"
    out = subprocess.run([sys.executable, str(script), "accuracy", *args], capture_output=True, text=True, timeout=300)
    assert out.returncode == 2 and message in out.stderr, out.stderr[-2000:]


def test_recheck_command_accepts_the_certificate_and_rejects_what_does_not_match(instance_files, capsys):
    """`unmask recheck` on recover's own output: accepted (exit 0); another instance, another X and a
    tampered error bound rejected (exit 1); an uncertified certificate claims nothing (exit 1); a JSON
    that is not a certificate is bad input (exit 2); --json is written only where asked."""
    tmp, problem, _ = instance_files
    W, B, X, cert = (str(tmp / f) for f in ("W.npy", "B.npy", "X_rc.npy", "cert_rc.json"))
    assert main(["recover", "--W", W, "--B", B, "--out", X, "--certificate", cert, "--quiet"]) == 0
    capsys.readouterr()
    base = ["recheck", "--W", W, "--B", B]
    assert main(base + ["--X", X, "--certificate", cert, "--json", str(tmp / "rc.json")]) == 0
    out = capsys.readouterr().out
    assert out.startswith("accepted:") and "error_bound = " in out
    record = json.loads((tmp / "rc.json").read_text())
    assert record["verdict"] == "accepted" and record["recomputed"]["status"] == "certified"

    other, _ = planted_instance(3, 6, 2, seed=5)
    np.save(tmp / "B_other.npy", other.B)
    assert main(["recheck", "--W", W, "--B", str(tmp / "B_other.npy"), "--X", X, "--certificate", cert]) == 1
    assert "rejected: certificate fingerprint does not match" in capsys.readouterr().out
    moved = np.load(X)
    moved[0, 0] += 1e-12
    np.save(tmp / "X_moved.npy", moved)
    assert main(base + ["--X", str(tmp / "X_moved.npy"), "--certificate", cert]) == 1
    assert "rejected: certificate does not match this X" in capsys.readouterr().out
    data = json.loads(Path(cert).read_text())
    (tmp / "tampered.json").write_text(json.dumps({**data, "error_bound": data["error_bound"] / 100}))
    assert main(base + ["--X", X, "--certificate", str(tmp / "tampered.json")]) == 1
    assert "rejected: error bound" in capsys.readouterr().out
    (tmp / "uncertified.json").write_text(json.dumps({**data, "status": "uncertified", "reason": "test"}))
    assert main(base + ["--X", X, "--certificate", str(tmp / "uncertified.json")]) == 1
    assert capsys.readouterr().out.startswith("nothing to recheck")
    # a reader that goes away (`unmask recheck ... | head -0`): exit 141 without a traceback
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-m", "unmask.cli", *base, "--X", X, "--certificate", cert, "--quiet"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()
    with proc.stderr:
        err = proc.stderr.read().decode()
    assert proc.wait(timeout=300) == 141 and "Traceback" not in err, err[-2000:]
    (tmp / "partial.json").write_text(json.dumps({k: v for k, v in data.items() if k != "X_digest"}))
    assert main(base + ["--X", X, "--certificate", str(tmp / "partial.json"), "--json", str(tmp / "no.json")]) == 2
    assert "missing X_digest" in capsys.readouterr().err and not (tmp / "no.json").exists()


def test_accuracy_benchmark_keeps_the_seeds_of_a_cell_stopped_midway(tmp_path, monkeypatch):
    """A long cell (one head (64, 128): about 20 min a seed) stopped after its second seed keeps both
    in its JSON, as a row marked partial, with each seed's recheck recorded."""
    import importlib.util
    import pathlib

    script = pathlib.Path(__file__).resolve().parents[1] / "benchmarks" / "recover_bench.py"
    spec = importlib.util.spec_from_file_location("recover_bench_under_test", script)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    calls = []

    def stopping(*a, **kw):  # the third instance never finishes
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return recover(*a, **kw)

    from solver.recover import recover
    monkeypatch.setattr(bench, "recover", stopping)
    out = tmp_path / "acc.json"
    with pytest.raises(KeyboardInterrupt):
        bench.main(["accuracy", "--families", "two", "--sizes", "3", "--mults", "2", "--seeds", "0,1,2,3",
                    "--json", str(out)])
    (row,) = json.loads(out.read_text())["rows"]
    assert row["partial"] and row["instances"] == 2 and row["seeds"] == [0, 1]
    assert [s["seed"] for s in row["per_seed"]] == [0, 1] and row["exact"] == 2
    assert all(s["rechecked"] and s["recheck_seconds"] > 0 for s in row["per_seed"]) and row["rechecked"] == 2


def test_float32_files_recover_and_recheck(instance_files, capsys):
    """W and B saved in float32: recover certifies the float64 promotion (float32 values are exact in
    float64), and recheck of the same files promotes them the same way, so the fingerprints match."""
    tmp, problem, _ = instance_files
    np.save(tmp / "W32.npy", np.asarray(problem.W, np.float32))
    np.save(tmp / "B32.npy", np.asarray(problem.B, np.float32))
    W, B, X, cert = (str(tmp / f) for f in ("W32.npy", "B32.npy", "X32.npy", "c32.json"))
    assert main(["recover", "--W", W, "--B", B, "--out", X, "--certificate", cert, "--quiet"]) == 0
    assert main(["recheck", "--W", W, "--B", B, "--X", X, "--certificate", cert, "--quiet"]) == 0
    assert capsys.readouterr().out.count("accepted:") == 1


def test_recheck_api_names_a_dict_that_is_not_a_certificate(instance_files):
    from proofs_check.recheck import recheck
    from solver.errors import CertificateMismatchError

    _, problem, X = instance_files
    with pytest.raises(CertificateMismatchError, match="not a certificate: missing"):
        recheck({"status": "certified"}, problem, X)
