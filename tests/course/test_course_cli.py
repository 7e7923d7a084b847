"""python -m miniengine: streaming generate, info, and one-line errors with exit status 2."""
import os
import subprocess
import sys

import pytest

from miniengine.paths import REPO_ROOT

pytestmark = pytest.mark.student_edition  # ships in the student edition (tests/conftest.py)


def run(*args, timeout=120):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "miniengine", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=REPO_ROOT, env=env)


def test_generate_streams_the_reference_completion(tok, target):
    from miniengine.reference import naive_generate
    from miniengine.sampling import SamplingParams

    r = run("generate", "def fibonacci(n):", "--max-tokens", "16")
    assert r.returncode == 0, r.stderr
    expected = naive_generate(target, [tok.encode("def fibonacci(n):").ids], SamplingParams(temperature=0, max_tokens=16))[0]
    assert r.stdout.rstrip("\n") == "def fibonacci(n):" + tok.decode(expected.token_ids)


def test_generate_sampled_is_reproducible():
    a = run("generate", "import os", "--max-tokens", "8", "--temperature", "0.8", "--top-k", "20", "--seed", "3")
    b = run("generate", "import os", "--max-tokens", "8", "--temperature", "0.8", "--top-k", "20", "--seed", "3")
    assert a.returncode == 0 and a.stdout == b.stdout


def test_info_prints_architecture_parameters_and_kv_bytes(target):
    r = run("info")
    assert r.returncode == 0, r.stderr
    c = target.config
    assert f"{target.num_parameters():,}" in r.stdout
    assert f"{2 * c.num_hidden_layers * c.num_key_value_heads * c.head_dim * 4:,} (fp32)" in r.stdout


@pytest.mark.parametrize("args,message", [
    (["generate", "x", "--temperature", "-1"], "temperature must be a finite number >= 0"),
    (["generate", "x", "--top-k", "-2"], "top_k must be an integer >= 0"),
    (["generate", "x", "--top-p", "0"], "top_p must be a number in (0, 1]"),
    (["generate", "x", "--max-tokens", "0"], "max_tokens must be an integer >= 1"),
    (["generate", "x", "--max-tokens", "ten"], "argument --max-tokens: invalid int value: 'ten'"),
    (["generate", "x", "--seed", "1.5"], "argument --seed: invalid int value: '1.5'"),
    (["generate", "x", "--max-tokens", "600"], "len(prompt) + max_tokens must be <= max_position_embeddings=512"),
    (["generate", "", "--max-tokens", "4"], "prompt must contain at least 1 token"),
    (["generate", "x", "--model", "no/such/dir"], "model='no/such/dir': no config.json there"),
    (["info", "--model", "no/such/dir"], "model='no/such/dir': no config.json there"),
    (["generate"], "the following arguments are required: prompt"),
    (["fly"], "invalid choice: 'fly'"),
    ([], "the following arguments are required: command"),
])
def test_bad_arguments_exit_2_with_one_line(args, message, capsys):
    """In this process, through the command's own main() (a new interpreter per case cost 2.8 s of CPU each; the
    next test runs the real command once)."""
    from miniengine.course.cli import main

    try:
        code = main(args)
    except SystemExit as e:  # argparse's own errors
        code = e.code
    err = capsys.readouterr().err
    assert code == 2
    assert message in err
    assert len(err.strip().splitlines()) == 1, err
    assert "Traceback" not in err


def test_a_bad_argument_exits_2_with_one_line_from_the_real_command():
    r = run("generate", "x", "--temperature", "-1")
    assert r.returncode == 2
    assert "temperature must be a finite number >= 0" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "Traceback" not in r.stderr
