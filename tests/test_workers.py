"""Long-lived workers (harness.runner.WorkerPool): one import per framework, a crash or a timeout fails
only its case, and nothing a case changes reaches the next one. Real frameworks, real processes."""

from __future__ import annotations

import json
import os
import subprocess
import textwrap
from pathlib import Path

import pytest

from harness.errors import SideCrashed
from harness.load import load_case, load_cases
from harness.runner import WorkerPool, current_pool, run_case, run_cases

from conftest import SMALL_WEIGHTED

SIDES = "  megatron: {framework: megatron, mode: compile}\n  paddle: {framework: paddle, impl: fp32_island}\n"
assert SIDES in SMALL_WEIGHTED
REPORT = SMALL_WEIGHTED.replace("all: bitwise", "all: report")


def with_sides(sides: str, text: str = REPORT) -> str:
    return text.replace(SIDES, textwrap.indent(textwrap.dedent(sides).strip() + "\n", "  "))


# A torch user function that records what it sees of the process (and, with a leak, changes all of it).
PROBE = '''\
import json, os, random
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

HERE = Path(__file__).parent


def observe():
    import torch.distributed as dist
    from megatron.core import parallel_state
    from megatron.core.fusions import fused_bias_swiglu
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list

    compiled = fused_bias_swiglu.weighted_swiglu
    code = getattr(compiled, "_torchdynamo_orig_callable", compiled).__code__
    return {
        "distributed": dist.is_initialized(),
        "model_parallel": parallel_state.model_parallel_is_initialized(),
        "master_port": os.environ.get("MASTER_PORT"),
        "leak_variable": os.environ.get("XFALIGN_LEAK"),
        "cwd": os.getcwd(),
        "deterministic": torch.are_deterministic_algorithms_enabled(),
        "default_dtype": str(torch.get_default_dtype()),
        "threads": torch.get_num_threads(),
        "torch_random": torch.rand(3).tolist(),
        "numpy_random": np.random.rand(2).tolist(),
        "python_random": random.random(),
        "dynamo_cache_entries": len(_debug_get_cache_entry_list(code)),
        "TORCHDYNAMO_DISABLE": os.environ.get("TORCHDYNAMO_DISABLE"),
    }


def leak():
    import torch.distributed as dist
    from megatron.core import parallel_state

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    parallel_state.initialize_model_parallel(1, 1)
    os.environ["XFALIGN_LEAK"] = "1"
    os.environ["MASTER_PORT"] = "29512"
    os.chdir("/")
    torch.use_deterministic_algorithms(True)
    torch.set_default_dtype(torch.float64)
    torch.set_num_threads(2)
    from megatron.core.fusions import fused_bias_swiglu

    fused_bias_swiglu.weighted_swiglu(torch.ones(4, 8), torch.ones(4, 1))  # compiled, and kept in dynamo's caches
    torch.manual_seed(1234)
    np.random.seed(1234)
    random.seed(1234)


def record(kind):
    with open(HERE / "observed.jsonl", "a") as out:
        out.write(json.dumps({"kind": kind, **observe()}) + "\\n")


def swiglu(x, bias, probs, options):
    record("probe")
    return _swiglu(x, probs)


def leaky_swiglu(x, bias, probs, options):
    leak()
    record("leak")
    return _swiglu(x, probs)


def _swiglu(x, probs):
    a, b = torch.chunk(x.float(), 2, -1)
    return (F.silu(a) * b * probs.float()).to(x.dtype)
'''


def observed(folder) -> list[dict]:
    path = folder / "observed.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.mark.xdist_group("in_process_frameworks")  # shares that test process's Megatron worker
def test_state_a_case_leaves_behind_is_reset(tmp_path, workers, monkeypatch):
    """distributed groups and Megatron's parallel state, MASTER_PORT and other variables, the working
    directory, deterministic flags, default dtype, threads, every RNG, dynamo's compile caches. With the
    session's workers: the Megatron worker may have served other tests' cases before (it must not matter)."""
    pool = workers
    spawned = pool.stats()["spawned"].get("megatron", 0)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "probe.py").write_text(PROBE)
    probe = tmp_path / "probe.yaml"
    probe.write_text(with_sides("""
        first: {framework: megatron, impl: 'probe.py:swiglu'}
        second: {framework: megatron, impl: 'probe.py:swiglu'}
    """))
    leaky = tmp_path / "leaky.yaml"
    leaky.write_text(with_sides("""
        builtin: {framework: megatron, mode: compile}
        leaky: {framework: megatron, impl: 'probe.py:leaky_swiglu'}
    """))
    linear = tmp_path / "linear.yaml"
    linear.write_text(textwrap.dedent("""\
        op: linear
        options: {bias: true}
        seed: 5
        inputs:
          x: {shape: [4, 16], dtype: float32}
          weight: {shape: [8, 16], dtype: float32}
          bias: {shape: [8], dtype: float32}
          grad_out: {shape: [4, 8], dtype: float32}
        sides:
          megatron: {framework: megatron, impl: megatron}
          again: {framework: megatron, impl: megatron}
        expect: {all: report}
        """))
    cases = [load_case(probe), load_case(leaky), load_case(linear), load_case(probe)]
    results = list(run_cases(cases, pool=pool, jobs=1))  # one case at a time: the sides run in this order
    assert all(not isinstance(run, SideCrashed) for _, run in results), results
    before, same_case, leaked, after, after_again = observed(tmp_path)
    assert leaked["kind"] == "leak" and leaked["distributed"] and leaked["leak_variable"] == "1"
    assert leaked["dynamo_cache_entries"] > 0  # the leaky side compiled megatron's weighted_swiglu
    for seen in (same_case, after, after_again):
        assert seen == before  # RNG draws included: every case starts from the same state
    assert before["distributed"] is False and before["model_parallel"] is False
    assert before["master_port"] is None and before["leak_variable"] is None  # linear sets no MASTER_PORT
    assert before["cwd"] == str(tmp_path)  # the parent's working directory
    assert before["deterministic"] is False and before["default_dtype"] == "torch.float32" and before["threads"] == 1
    assert before["dynamo_cache_entries"] == 0
    assert pool.stats()["spawned"]["megatron"] - spawned <= 1  # one worker served it all (started here, or earlier)


@pytest.mark.xdist_group("in_process_frameworks")  # shares that test process's Megatron worker
def test_a_side_that_changes_its_working_directory_cannot_move_its_dump(tmp_path, workers, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "probe.py").write_text(PROBE)
    leaky = tmp_path / "leaky.yaml"
    leaky.write_text(with_sides("""
        builtin: {framework: megatron, mode: compile}
        leaky: {framework: megatron, impl: 'probe.py:leaky_swiglu'}
    """))
    run = run_case(load_case(leaky), {"builtin": Path("out/builtin"), "leaky": Path("out/leaky")}, pool=workers)
    assert run.comparison is not None
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["builtin", "leaky"]
    assert (tmp_path / "out" / "leaky" / "meta.json").is_file()  # where it was asked for, not under /


@pytest.mark.slow  # a run of its own, with fresh workers, one of which crashes
def test_one_import_per_framework_and_a_crash_fails_only_its_case(tmp_path, workers, monkeypatch):
    """With the session's workers, the Paddle one started first: each fault restarts it once, and only the
    faulty case fails."""
    monkeypatch.chdir(tmp_path)
    pool = workers
    (tmp_path / "f.py").write_text(textwrap.dedent("""\
        import os, signal, sys, time
        import paddle

        def swiglu(x, bias, probs, options):
            a, b = paddle.chunk(x.cast("float32"), 2, axis=-1)
            return (paddle.nn.functional.silu(a) * b * probs).cast(x.dtype)

        def segfault(x, bias, probs, options):
            print("about to crash", flush=True)
            os.kill(os.getpid(), signal.SIGSEGV)

        def exits(x, bias, probs, options):
            os._exit(7)

        def hangs(x, bias, probs, options):
            print("hanging", flush=True)
            time.sleep(1000)
        """))

    def case(name: str, impl: str, extra: str = "") -> object:
        path = tmp_path / f"{name}.yaml"
        path.write_text(with_sides(f"""
            ref: {{framework: paddle, impl: fp32_island}}
            user: {{framework: paddle, impl: 'f.py:{impl}'}}
        """).replace("seed: 3", f"seed: 3\nname: {name}{extra}"))
        return load_case(path)

    warm = case("warm", "swiglu")
    run_case(warm, pool=pool)  # the Paddle worker is up: the count below starts from a live worker
    spawned = pool.stats()["spawned"]["paddle"]
    # one case at a time (jobs=1): the hanging case runs on a worker warmed by ok3, so its short timeout does
    # not include a framework import (a fresh worker's first job counts it)
    cases = [case("ok1", "swiglu"), case("crash", "segfault"), case("ok2", "swiglu"), case("exit", "exits"),
             case("ok3", "swiglu"), case("hang", "hangs", "\ntimeout: 1"), case("ok4", "swiglu")]
    results = dict((c.name, run) for c, run in run_cases(cases, pool=pool, jobs=1))
    assert [name for name, run in results.items() if isinstance(run, SideCrashed)] == ["crash", "exit", "hang"]
    assert str(results["crash"]).startswith("side 'user' was killed by SIGSEGV (signal 11); last ")
    assert "about to crash" in str(results["crash"])
    assert str(results["exit"]).startswith("side 'user' exited before writing its dump (exit 7)")
    assert str(results["hang"]).startswith("side 'user' timed out after 1 s; last 1 lines of its output:\n  hanging")
    for name in ("ok1", "ok2", "ok3", "ok4"):
        assert results[name].comparison.passed and results[name].comparison.status == "pass"
    # one new worker after each of the three faults, none for the cases that passed
    assert pool.stats()["spawned"]["paddle"] == spawned + 3


@pytest.mark.slow  # a fresh Megatron worker (~5 s); compile vs eager bits: test_end_to_end's test_megatron_mode_is_applied
def test_compile_and_eager_switch_at_runtime_match_fresh_workers(tmp_path, workers, monkeypatch):
    """One worker runs compiled then eager Megatron (eager switched at runtime; the session's worker, which
    may have run compiled cases before); a worker whose first case is eager gives the same bits, and the
    same compiled bits in its next, compiled, case (a compiled function first called in eager mode must
    not stay eager)."""
    monkeypatch.chdir(tmp_path)
    text = with_sides("""
        compiled: {framework: megatron, mode: compile}
        eager: {framework: megatron, mode: eager}
    """).replace("[16, 64]", "[64, 512]").replace("[16, 1]", "[64, 1]").replace("[16, 32]", "[64, 256]")
    (tmp_path / "both.yaml").write_text(text)
    (tmp_path / "eager.yaml").write_text(text.replace("  compiled: {framework: megatron, mode: compile}\n", "")
                                         .replace("  eager: {framework: megatron, mode: eager}\n",
                                                  "  eager: {framework: megatron, mode: eager}\n"
                                                  "  again: {framework: megatron, mode: eager}\n"))
    both, eager_only = load_case(tmp_path / "both.yaml"), load_case(tmp_path / "eager.yaml")
    spawned = workers.stats()["spawned"].get("megatron", 0)
    run = run_case(both, pool=workers, dump_dirs={"compiled": tmp_path / "c", "eager": tmp_path / "e"})
    assert workers.stats()["spawned"]["megatron"] - spawned <= 1  # both sides in one worker
    (tmp_path / "compiled.yaml").write_text(text.replace("  eager: {framework: megatron, mode: eager}\n",
                                                         "  again: {framework: megatron, mode: compile}\n"))
    compiled_only = load_case(tmp_path / "compiled.yaml")
    with WorkerPool(jobs=1) as fresh:
        alone = run_case(eager_only, pool=fresh, dump_dirs={"eager": tmp_path / "e2"})
        after_eager = run_case(compiled_only, pool=fresh, dump_dirs={"compiled": tmp_path / "c2"})
        assert fresh.stats()["spawned"] == {"megatron": 1}
    digests = lambda dump: {t["name"]: t["md5"] for t in dump.meta["tensors"]}  # noqa: E731
    assert digests(run.dumps["eager"]) == digests(alone.dumps["eager"])
    assert digests(after_eager.dumps["compiled"]) == digests(run.dumps["compiled"])
    assert digests(run.dumps["compiled"]) != digests(run.dumps["eager"])  # the mode did switch
    assert run.dumps["eager"].meta["environment"]["compile_stance"] == "force_eager"
    assert run.dumps["compiled"].meta["environment"]["compile_stance"] == "default"


def test_default_pool_is_used_by_run_case_and_the_cli_and_closing_it_kills_every_worker_group(
        tmp_path, monkeypatch, capsys):
    from harness.cli import main

    monkeypatch.chdir(tmp_path)
    path = tmp_path / "case.yaml"
    path.write_text(with_sides("""
        a: {framework: paddle, impl: fp32_island}
        b: {framework: paddle, impl: per_op_rounding}
    """).replace("seed: 3\n", "seed: 3\nsweep:\n  seed: [1, 2, 3]\n"))
    previous = current_pool()  # the test session's, if conftest made one
    with WorkerPool(jobs=2) as pool, pool.as_default():
        assert current_pool() is pool
        assert main(["run", str(path), "--html", str(tmp_path / "html")]) == 0
        run_case(load_cases(path)[0])
        assert pool.stats()["spawned"] == {"paddle": 1, "megatron": 1}  # megatron: the float64 reference's worker
        pids = [process.popen.pid for process in pool._processes]
        workdir = pool.workdir
        assert pids and all(os.path.exists(f"/proc/{pid}") for pid in pids)
    assert current_pool() is previous
    for pid in pids:  # closing the pool killed every worker's group and removed its folder
        state = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] if os.path.exists(f"/proc/{pid}") else "X"
        assert state in ("Z", "X")
    assert not workdir.exists()
    out = capsys.readouterr().out
    # not a terminal: one plain progress line per case, in case order
    progress = [line.split(" (")[0] for line in out.splitlines() if line.startswith("[")]
    assert progress == ["[1/3] case[seed=1]", "[2/3] case[seed=2]", "[3/3] case[seed=3]"]
    assert out.index("[1/3]") < out.index("PASS case[seed=1]") < out.index("[2/3]") < out.index("PASS case[seed=2]")


def test_jobs_option_and_ordered_output(tmp_path, monkeypatch, capsys):
    """-j 1 and -j 2 print the same results in the same (case) order; -j 0 is refused. In this process
    (the session's workers): what -j changes is how many cases run at once, not which workers."""
    from harness.cli import main

    monkeypatch.chdir(tmp_path)
    path = tmp_path / "case.yaml"
    path.write_text(with_sides("""
        a: {framework: paddle, impl: fp32_island}
        b: {framework: paddle, impl: per_op_rounding}
    """).replace("seed: 3\n", "seed: 3\nsweep:\n  seed: [1, 2, 3, 4]\n"))

    def run(*args):
        capsys.readouterr()
        code = main(["run", str(path), "--html", "h", *args])
        out, err = capsys.readouterr()
        return subprocess.CompletedProcess(args, code, out, err)

    one, two = run("-j", "1"), run("-j", "2")
    assert one.returncode == two.returncode == 0, (one.stdout, two.stdout, one.stderr, two.stderr)
    verdicts = lambda out: [line for line in out.splitlines() if line.startswith(("PASS", "FAIL"))]  # noqa: E731
    assert verdicts(one.stdout) == verdicts(two.stdout) and len(verdicts(one.stdout)) == 4
    assert verdicts(one.stdout)[0].startswith("PASS case[seed=1]")
    bad = run("-j", "0")
    assert bad.returncode == 2 and bad.stderr.strip() == "xfalign: error: -j must be >= 1 (got 0)"
