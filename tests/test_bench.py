"""``polyfuse bench`` on a machine without a GPU (issue 25): the command parses and refuses in one line, the cases
and sweeps it would run, the report and the plots of a recorded run (tests/data/gpu_bench_sample.json, times of
an H100 run). The benchmark itself runs on a GPU only (benchmarks/README.md)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from polyfuse import ops
from polyfuse.bench import baselines
from polyfuse.bench.cases import SWEEP_STEPS, cases, sweep_axis
from polyfuse.bench.report import correctness, markdown, polyfuse_ok, source_digest, table
from polyfuse.cli import build_parser, main

SAMPLE = Path(__file__).resolve().parent / "data" / "gpu_bench_sample.json"


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_the_command_parses_its_options():
    args = build_parser().parse_args(["bench", "attn_causal", "--sweep", "--mode", "prefill", "--set", "D=64",
                                      "--no-compile", "--no-reference", "--out", "here", "--loader", "cuda-python",
                                      "--warmup", "5", "--rep", "20", "--seed", "3", "--rounds", "5"])
    assert (args.op, args.sweep, args.mode, args.set, args.no_compile, args.no_reference) == (
        "attn_causal", True, "prefill", [("D", 64)], True, True)
    assert (str(args.out), args.loader, args.warmup, args.rep, args.seed) == ("here", "cuda-python", 5.0, 20.0, 3)
    assert args.rounds == 5 and build_parser().parse_args(["bench", "softmax"]).rounds == 3


def test_without_the_bench_extra_it_exits_4_in_one_line(capsys, monkeypatch):
    for name in ("torch", "tqdm", "matplotlib"):  # import fails, find_spec says it is not installed
        monkeypatch.setitem(sys.modules, name, None)
    code, out, err = cli(capsys, "bench", "softmax", "--sweep")
    assert code == 4 and out == ""
    assert err == "polyfuse: bench needs torch, tqdm, matplotlib, not installed here (pip install 'polyfuse[bench]')\n"


def test_without_a_gpu_it_exits_4_in_one_line(capsys):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a CUDA GPU is visible: the command would run the benchmark")
    code, out, err = cli(capsys, "bench", "softmax")
    assert code == 4 and out == ""
    assert err.count("\n") == 1 and "bench needs a CUDA GPU visible to PyTorch" in err


@pytest.mark.parametrize(("argv", "message"), [
    (("nope",), "no operator 'nope' in the catalog"),
    (("softmax", "--mode", "decode"), "operator 'softmax' has no mode or preset 'decode'"),
    (("attn_causal", "--set", "Q=3", "--sweep"), "operator 'attn_causal' has no size 'Q'"),
])
def test_user_errors_exit_3_before_anything_is_imported(capsys, monkeypatch, argv, message):
    monkeypatch.setitem(sys.modules, "torch", None)
    code, _, err = cli(capsys, "bench", *argv)
    assert code == 3 and err.startswith(f"polyfuse: error: {message}") and err.count("\n") == 1


def test_bench_cases_are_the_presets_with_the_sizes_set():
    found = cases(ops.get("attn_global"), "bench", overrides={"D": 32})
    assert [c.key for c in found] == ["prefill", "decode", "decode_b32"]
    assert [c.mode for c in found] == ["prefill", "decode", "decode"]
    assert all(c.sizes["D"] == 32 and c.axis == () for c in found)
    assert [c.key for c in cases(ops.get("attn_global"), "bench", {"decode"})] == ["decode", "decode_b32"]


def test_a_prefill_sweep_moves_queries_and_keys_together():
    found = cases(ops.get("attn_causal"), "sweep", {"prefill"})
    assert [c.key for c in found] == [f"prefill_s{n}" for n in (1024, 2048, 4096, 8192, 16384)]
    assert all(c.sizes["Sq"] == c.sizes["Skv"] and c.group == "prefill" and c.axis == ("Sq", "Skv")
               for c in found)
    assert {c.sizes["D"] for c in found} == {128}


@pytest.mark.parametrize("name", ops.names())
def test_every_operator_sweeps_each_preset_along_its_axis(name):
    op = ops.get(name)
    found = cases(op, "sweep")
    steps = {key: sweep_axis(name, case_mode(op, key)) for key in op.presets}
    assert len(found) == sum(len(a.values) or len(SWEEP_STEPS) for a in steps.values())
    for case in found:
        preset = op.presets[case.group]
        axis = sweep_axis(name, case.mode)
        scaled = {preset[axis.names[0]] * 2**k if k >= 0 else preset[axis.names[0]] >> -k for k in SWEEP_STEPS}
        assert case.axis == axis.names and {case.sizes[n] for n in axis.names} <= (set(axis.values) or scaled)
        assert all(case.sizes[n] == preset[n] for n in preset if n not in axis.names)


def case_mode(op, key: str) -> str:
    return key if key in op.modes else key.split("_")[0]


def test_row_and_decode_sweeps_run_the_lengths_the_rules_change_at():
    rows = cases(ops.get("rmsnorm_amax"), "sweep")
    assert [c.sizes["M"] for c in rows] == [1024, 4096, 8192, 32768]
    decode = cases(ops.get("attn_gqa"), "sweep", {"decode"})
    assert [c.sizes["Skv"] for c in decode] == [1024, 4096, 32768]


def test_the_baselines_import_without_torch_and_cover_the_catalog():
    assert baselines.names() == ops.names()
    assert baselines.flops("quant_gemm", "default", {"M": 2, "N": 3, "K": 5}) == 60


def test_the_report_of_a_recorded_run():
    data = json.loads(SAMPLE.read_text())
    rows = table(data["cases"])
    assert len(rows) == 2 + len(data["cases"])
    softmax = data["cases"][-1]
    assert "| softmax | default | N=4096 M=4096 | 0.0610 | 0.0740 | 0.0520 |" in rows[-1]
    assert correctness(softmax) == "ref OK (1.0e-09)" and polyfuse_ok(softmax)
    failed = {**softmax, "candidates": {**softmax["candidates"], "polyfuse": {"error": "schedule/build failed"}}}
    assert not polyfuse_ok(failed) and correctness(failed) == "polyfuse: error"
    assert "torch.softmax: RuntimeError: example failure" in markdown(data["cases"], data)


def test_the_header_names_the_sources_measured():
    # A run from a copy of a working tree records a digest of polyfuse's sources beside git's HEAD (which may be
    # the copy's stale one): the header prints it, and an older record without it says so.
    digest = source_digest()
    assert len(digest) == 12 and int(digest, 16) >= 0 and digest == source_digest()
    data = json.loads(SAMPLE.read_text())
    assert "(sources not recorded)" in markdown(data["cases"], data)
    assert f"(sources {digest})" in markdown(data["cases"], {**data, "sources": digest})


def test_the_plots_of_a_recorded_run(tmp_path):
    pytest.importorskip("matplotlib")
    from polyfuse.bench.plot import groups, plot_file

    data = json.loads(SAMPLE.read_text())
    assert {key: len(records) for key, records in groups(data).items()} == {
        ("attn_causal", "prefill"): 3, ("attn_global", "prefill"): 2, ("softmax", "default"): 1}
    written = plot_file(SAMPLE, tmp_path)
    assert sorted(p.name for p in written) == ["gpu_bench_attn_causal_prefill.png",
                                               "gpu_bench_attn_global_prefill.png", "gpu_bench_softmax_default.png"]
    for path in written:
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 10_000


def test_a_case_without_products_is_reported_against_a_copy_of_as_many_bytes():
    data = json.loads(SAMPLE.read_text())
    rec = next(r for r in data["cases"] if not r.get("flops") and "ms" in r["candidates"]["polyfuse"])
    copy = {**rec, "copy_ms": rec["candidates"]["polyfuse"]["ms"] * 0.95}
    assert "(95% of copy)" in "\n".join(table([copy]))
    assert "of copy" not in "\n".join(table([rec]))


def test_timings_alternate_over_the_candidates_in_rounds(monkeypatch):
    # every candidate (and the copy) is timed once per round, in turn; one whose timing fails leaves the rounds
    # with its error recorded, the others go on
    from polyfuse.bench import measure

    monkeypatch.setattr(measure, "context_broken", lambda err: None)
    order: list[str] = []
    clock = iter(range(100))

    def timer(fn):
        label = fn()
        order.append(label)
        if label == "eager" and order.count("eager") == 2:
            raise RuntimeError("example failure")
        return float(next(clock))

    rec = {"candidates": {"polyfuse": {}, "eager": {}}, "notes": []}
    timed = {label: (lambda label=label: label) for label in ("polyfuse", "eager", "copy")}
    times = measure.time_rounds(timed, 3, timer, lambda label: None, rec)
    assert order == ["polyfuse", "eager", "copy", "polyfuse", "eager", "copy", "polyfuse", "copy"]
    assert times == {"polyfuse": [0.0, 3.0, 5.0], "copy": [2.0, 4.0, 6.0]}
    assert rec["candidates"]["eager"]["error"] == "RuntimeError: example failure"


def test_rounds_are_at_least_one_and_named_in_the_header():
    from polyfuse.bench.measure import BenchOptions
    from polyfuse.errors import PolyfuseError

    with pytest.raises(PolyfuseError, match="at least one round"):
        BenchOptions(rounds=0)
    data = json.loads(SAMPLE.read_text())
    assert "rounds" not in markdown(data["cases"], data)  # a record from before: one timing each
    assert "the least of 3 rounds alternating over the candidates" in markdown(data["cases"], {**data, "rounds": 3})
