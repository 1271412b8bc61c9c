"""bench/probes/rule_check.py, the on/off rules a device call applies to its probes' outputs (CPU only): each rule
turns a switch off for the reason it names, on a probe output and a pytest log written here in the probes' formats."""
import importlib.util
import json
from pathlib import Path

import pytest

_path = Path(__file__).resolve().parents[1] / "bench" / "probes" / "rule_check.py"
_spec = importlib.util.spec_from_file_location("rule_check", _path)
rc = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(rc)


def _row(op0, op1, **extra):
    """A vt_peel_kernel.py / switch_ab.py row: per-round times of each arm, their medians, and `extra`."""
    d = {f"op0_r{r}_ms": t for r, t in enumerate(op0)} | {f"op1_r{r}_ms": t for r, t in enumerate(op1)}
    d |= {"op0_median_ms": sorted(op0)[len(op0) // 2], "op1_median_ms": sorted(op1)[len(op1) // 2]}
    return d | extra


def _write(tmp_path, rows, name="probe.txt"):
    p = tmp_path / name
    p.write_text("wan14 cute PSA_X {}\n" + "RESULT " + json.dumps({"rounds": 7, "envs": ["PSA_X"], **rows}) + "\n")
    return str(p)


FAST = ([7.0] * 7, [6.9] * 6 + [7.1])  # switched on: faster in 6 of 7 rounds


def test_a_switch_faster_in_enough_rounds_is_on(tmp_path, capsys):
    out = _write(tmp_path, {"wan14_cute_PSA_CUTE_X": _row(*FAST, maxdiff=0.0),
                            "wan14_720_cute_PSA_CUTE_X": _row(*FAST, maxdiff=0.0)})
    rc.main(["PSA_CUTE_X", out, "--faster-rounds", "6", "--bitwise"])
    text = capsys.readouterr().out
    assert "DECISION PSA_CUTE_X on: every rule holds" in text
    assert "wan14_cute_PSA_CUTE_X: 7.0000 -> 6.9000 ms (-1.4%), faster in 6 rounds, maxdiff 0" in text


@pytest.mark.parametrize("rows, args, why", [
    ({"a_PSA_CUTE_X": _row([7.0] * 7, [6.9] * 5 + [7.1] * 2)}, ["--faster-rounds", "6"], "faster in 5 rounds (< 6)"),
    ({"a_PSA_CUTE_X": _row(*FAST, maxdiff=0.0078)}, ["--bitwise"], "outputs differ"),
    ({"a_PSA_CUTE_X": _row(*FAST, novt_median_ms=5.30, novt1_median_ms=5.35)}, ["--novt-not-slower"],
     "the exact part slower"),
    ({"a_PSA_CUTE_X": _row([7.0] * 5, [7.3] * 5)}, ["--max-ratio", "1.03"], "+4.3% (> +3.0%)"),
    ({"a_PSA_CUTE_X": _row([7.0] * 5, [7.1] * 5, op0_peak_extra_x_q=1.74, op1_peak_extra_x_q=1.02)},
     ["--peak-below", "1.0"], "peak 1.02x q"),
    ({"a_PSA_CUTE_X": {"error": "RuntimeError: boom"}}, [], "RuntimeError: boom"),
    ({"a_PSA_CUTE_Y": _row(*FAST)}, [], "no row holding 'PSA_CUTE_X'"),
])
def test_each_rule_turns_the_switch_off_for_its_reason(tmp_path, capsys, rows, args, why):
    rc.main(["PSA_CUTE_X", _write(tmp_path, rows), *args])
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith("DECISION PSA_CUTE_X off: ") and why in last, last


def test_replay_medians_decide_where_a_row_has_them(tmp_path, capsys):
    # (switch_ab.py's graphed FLUX.1 rows: the eager medians carry host time, the replays the GPU's alone)
    row = _row([0.30] * 5, [0.33] * 5, op0_replay_median_ms=0.250, op1_replay_median_ms=0.245)
    rc.main(["PSA_STATS_GLUON", _write(tmp_path, {"flux_cute": row}), "--rows", "", "--max-ratio", "1.0"])
    assert capsys.readouterr().out.strip().endswith("DECISION PSA_STATS_GLUON on: every rule holds")


def test_the_pytest_log_counts_only_its_switchs_failures(tmp_path, capsys):
    log = tmp_path / "tests.log"
    log.write_text("..F.\nFAILED tests/test_cute_pair_gpu.py::test_vt_full_against_the_shipped_virtual_loop[x] - A\n"
                   "1 failed, 30 passed in 80.1s\n")
    out = _write(tmp_path, {"a_PSA_CUTE_LAZY_RESCALE": _row(*FAST), "a_PSA_CUTE_VT_FULL": _row(*FAST)})
    rc.main(["PSA_CUTE_LAZY_RESCALE", out, "--tests", str(log), "--tests-k", "lazy"])
    assert capsys.readouterr().out.strip().endswith("on: every rule holds")
    rc.main(["PSA_CUTE_VT_FULL", out, "--tests", str(log), "--tests-k", "vt_full"])
    assert "DECISION PSA_CUTE_VT_FULL off: tests: 1 failed, 30 passed" in capsys.readouterr().out
    log.write_text("....\n")  # cut by its timeout: no summary
    rc.main(["PSA_CUTE_LAZY_RESCALE", out, "--tests", str(log), "--tests-k", "lazy"])
    assert "off: tests: no pytest summary" in capsys.readouterr().out


def _clocks(tmp_path, times):
    """A bench/probes/split_clocks.py output: {build: ms} at T 32760, clocks 1650 MHz."""
    rows = {b: {"iterations": 50, "ms_median": ms, "sm_clock_mhz_median": 1650.0} for b, ms in times.items()}
    p = tmp_path / "clocks.txt"
    p.write_text("32760 novt {}\n" + "RESULT " + json.dumps({"inputs": "ditlike-morton", "32760": rows}) + "\n")
    return str(p)


@pytest.mark.parametrize("share_pwt2, decision", [(5.70, "on"), (5.95, "off")])
def test_split_clocks_rows_decide_the_shared_pipeline(tmp_path, capsys, share_pwt2, decision):
    # U30's rule on split_clocks.py's output: every share: build >= 3% faster than its twin, in both rounds ("#2")
    out = _clocks(tmp_path, {"novt": 5.2, "share:novt": 4.9, "pwt": 6.0, "share:pwt": 5.7,
                             "share:novt#2": 4.95, "novt#2": 5.25, "share:pwt#2": share_pwt2, "pwt#2": 6.0})
    rc.main(["PSA_CUTE_PAIR_SHARE", out, "--clocks", "0.97"])
    text = capsys.readouterr().out
    assert f"DECISION PSA_CUTE_PAIR_SHARE {decision}" in text
    assert "T 32760 novt: 5.2000 -> 4.9000 ms (-5.8%), 1650 -> 1650 MHz, 8.58 -> 8.09 M cycles" in text
    assert sum(line.startswith("T 32760 ") for line in text.splitlines()) == 4
    if decision == "off":
        assert "T 32760 pwt#2: -0.8% (> -3.0%)" in text


def test_split_clocks_without_twins_is_off(tmp_path, capsys):
    rc.main(["PSA_CUTE_PAIR_SHARE", _clocks(tmp_path, {"novt": 5.2, "pwt": 6.0}), "--clocks", "1.01"])
    assert "DECISION PSA_CUTE_PAIR_SHARE off: no build with a 'share:' twin" in capsys.readouterr().out


def test_vs_row_measures_the_switched_arm_against_an_unchanged_row(tmp_path, capsys):
    # (switch_ab.py's wan14_none: the node's layout unordered, which the Morton switches do not change: the median
    # of all its rounds is the yardstick of Morton's time as the node sees it)
    none = _row([7.36, 7.40, 7.30], [7.38, 7.30, 7.50])  # its six rounds' median 7.37
    ok = {"wan14_cute": _row([7.2] * 3, [7.52] * 3), "wan14_none_cute": none}
    rc.main(["PSA_MORTON_ROLL", _write(tmp_path, ok), "--rows", "wan14", "--vs-row", "wan14_none", "--vs-max", "1.03"])
    text = capsys.readouterr().out
    assert "wan14_cute on: 7.5200 ms against wan14_none 7.3700 (+2.0%)" in text
    assert "DECISION PSA_MORTON_ROLL on: every rule holds" in text
    slow = {"wan14_cute": _row([7.2] * 3, [7.62] * 3), "wan14_none_cute": none}
    rc.main(["PSA_MORTON_ROLL", _write(tmp_path, slow), "--rows", "wan14", "--vs-row", "wan14_none",
             "--vs-max", "1.03"])
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith("DECISION PSA_MORTON_ROLL off: ") and "+3.4% over wan14_none (> +3.0%)" in last, last
    rc.main(["PSA_MORTON_ROLL", _write(tmp_path, {"wan14_cute": _row([7.2] * 3, [7.3] * 3)}), "--rows", "wan14",
             "--vs-row", "wan14_none"])
    assert "no reference row holding 'wan14_none'" in capsys.readouterr().out.strip().splitlines()[-1]
