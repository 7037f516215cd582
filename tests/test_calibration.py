"""Confidence that means something: fitted on the scenarios whose answer is known, judged on
scenarios the fit did not see, and a verdict too weak to act on says "cannot tell" with what to
collect instead of guessing."""

from __future__ import annotations

import pytest

from postmortem import api, calibration, catalog, summary

from .conftest import CORPORA, SAMPLES, evaluated


def outcomes() -> list[calibration.Outcome]:
    rows = [evaluated(p.parent) for root in CORPORA for p in sorted(root.glob("*/expected.json"))]
    return [calibration.Outcome(r["scenario"], r["found"], r["evidence_kind"] or "text_log",
                                bool(r["guess_ok"] and r["culprit_ok"] is not False)) for r in rows if r["found"]]


def test_the_strongest_evidence_names_a_findings_kind():
    kind_of = {"logs/0/stdout.log": "text_log", "nccl_trace_rank_1": "flight_recorder", "r1.pyspy": "pyspy"}
    assert calibration.evidence_kind(["logs/0/stdout.log", "r1.pyspy", "nccl_trace_rank_1"], kind_of) == "flight_recorder"
    assert calibration.evidence_kind(["logs/0/stdout.log", "r1.pyspy"], kind_of) == "pyspy"
    assert calibration.evidence_kind([None, "gone.log"], kind_of) == "text_log"
    # an excerpt's lines that name no rank are weaker evidence than a rank's own log
    assert calibration.evidence_kind(["logs/0/stdout.log"], kind_of, ranked=False) == "text_log, no rank"


def test_a_fit_is_smoothed_toward_its_signature_and_a_signature_never_judged_keeps_its_own_figure():
    table = {("collective-timeout", "text_log"): (9, 12), ("collective-timeout", "flight_recorder"): (1, 1)}
    prior = (10 + 1) / (13 + 2)
    assert calibration.fitted(table, "collective-timeout", "text_log", 0.6) == pytest.approx((9 + 2 * prior) / 14)
    # one right verdict from a dump is not certainty: it stays near the signature's rate
    assert calibration.fitted(table, "collective-timeout", "flight_recorder", 0.6) == pytest.approx((1 + 2 * prior) / 3)
    assert calibration.fitted(table, "collective-timeout", "pyspy", 0.6) == pytest.approx(prior)
    assert calibration.fitted(table, "straggler", "text_log", 0.42) == 0.42


def test_leave_one_out_judges_each_scenario_by_a_fit_that_never_saw_it():
    wrong = calibration.Outcome("a", "nccl-error", "text_log", False)
    right = calibration.Outcome("b", "nccl-error", "text_log", True)
    (conf_a, ok_a), (conf_b, ok_b) = calibration.leave_one_out([wrong, right], {"nccl-error": 0.5})
    assert (ok_a, ok_b) == (False, True)
    assert conf_a == pytest.approx((1 + 2 * 2 / 3) / 3)  # fitted on b alone: one right of one
    assert conf_b == pytest.approx((0 + 2 * 1 / 3) / 3)  # fitted on a alone: none right of one


def test_the_committed_table_is_the_fit_of_todays_verdicts():
    """signatures/calibration.toml is what `postmortem eval sample_logs/ tests/realworld/
    --fit-confidence signatures/calibration.toml` writes today: a check that changed its verdicts
    must be refitted, or the confidences it reports are of another analyzer."""
    committed = calibration.load()
    fresh = calibration.tally(outcomes())
    own = {s.id: s.confidence for s in catalog.load_all()[0]}
    for signature, kind in fresh:
        now = calibration.fitted(fresh, signature, kind, own[signature])
        then = calibration.fitted(committed, signature, kind, own[signature])
        assert abs(now - then) <= 0.05, (signature, kind, then, now)


def test_confidence_is_reliable_on_scenarios_the_fit_did_not_see():
    own = {s.id: s.confidence for s in catalog.load_all()[0]}
    pairs = calibration.leave_one_out(outcomes(), own)
    assert len(pairs) >= 100
    for bucket in calibration.reliability(pairs):
        if bucket["verdicts"] >= 10:  # a bucket's rate is at least (nearly) what it claims
            low = float(bucket["bucket"].split("-")[0].rstrip("%")) / 100
            assert bucket["fraction_right"] >= low - 0.1, bucket
    confident = [ok for conf, ok in pairs if conf >= 0.9]
    assert sum(confident) / len(confident) >= 0.9


def test_a_weak_verdict_says_cannot_tell_and_what_to_collect_instead_of_guessing():
    weak = {"signature": "collective-timeout", "summary": "rank 0 timed out in all_reduce", "confidence": 0.41,
            "culprit_ranks": [], "user_line": None, "evidence_kind": "text_log"}
    told = summary._cannot_tell(weak, {"text_log"}, ranked=True)
    assert told["cannot_tell"] and told["summary"].startswith("cannot tell: perhaps rank 0 timed out")
    assert any("py-spy dump" in c for c in told["collect"]) and any("TORCH_NCCL_TRACE_BUFFER_SIZE" in c
                                                                   for c in told["collect"])
    sure = summary._cannot_tell({**weak, "confidence": 0.9}, {"text_log"}, ranked=True)
    assert not sure["cannot_tell"] and sure["collect"] == [] and sure["summary"] == weak["summary"]


def test_an_excerpt_naming_no_rank_and_no_failure_says_what_to_collect(tmp_path):
    case = CORPORA[1] / "c_nanogpt_gradscaler_deprecation_benign_704"  # a healthy run's pasted warnings
    for log in case.iterdir():
        if log.name != "expected.json":
            (tmp_path / log.name).write_bytes(log.read_bytes())
    verdict = api.analyze(tmp_path, keep=False)["verdict"]
    assert verdict["signature"] is None and not verdict["cannot_tell"]
    assert any("--log-dir" in c for c in verdict["collect"])


def test_eval_fits_the_table_and_prints_the_leave_one_out_reliability(tmp_path):
    from typer.testing import CliRunner

    from postmortem.cli import app

    out = tmp_path / "calibration.toml"
    result = CliRunner().invoke(app, ["eval", str(SAMPLES / "rank_sigkill"), str(SAMPLES / "hang_dataloader"),
                                      "--fit-confidence", str(out)])
    assert result.exit_code == 0, result.output
    assert "leave-one-out" in result.output
    table = calibration.load(out)
    assert table[("rank-crash", "text_log")] == (1, 1) and table[("collective-hang", "flight_recorder")] == (1, 1)
