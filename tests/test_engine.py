"""The signature engine: signature files as data, safe queries and templates, roles and verdicts."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from postmortem import api, catalog, engine
from postmortem.cli import app
from postmortem.errors import PostmortemError

from .conftest import evaluated, sample_dir, scenario_names

MINIMAL = """
id = "{id}"
title = "t"
severity = "warning"
role = "symptom"
description = "d"
queries = ["{query}"]
summary = "{summary}"
"""


def write_sig(path, id="my-sig", query="SELECT rank, ts, file, line_no AS line, message AS text FROM events "
              "WHERE run_id = $run_id AND kind = 'exception'", summary="seen on {ranks}"):
    path.write_text(MINIMAL.format(id=id, query=query, summary=summary))
    return path


def test_builtin_signatures_load_and_use_contract_ids():
    found, broken = catalog.load_all()
    assert broken == []
    assert {s.id for s in found} <= set(catalog.CONTRACT_IDS)
    assert all(s.limits.strip() for s in found), "every signature says what a match does not establish"


def test_a_broken_user_signature_is_reported_and_skipped(tmp_path):
    (tmp_path / "bad.toml").write_text("id = 'x'\ntitle = [unclosed")
    (tmp_path / "incomplete.toml").write_text('id = "y"\ntitle = "t"\n')
    write_sig(tmp_path / "good.toml")
    found, broken = catalog.load_all(tmp_path)
    assert "my-sig" in {s.id for s in found}
    reasons = dict(broken)
    assert "not valid TOML" in reasons[str(tmp_path / "bad.toml")]
    assert "missing or empty" in reasons[str(tmp_path / "incomplete.toml")]


def test_user_signature_runs_in_analyze_and_a_failing_one_does_not_stop_the_others(tmp_path):
    write_sig(tmp_path / "good.toml")
    write_sig(tmp_path / "typo.toml", id="broken", query="SELECT no_such_column FROM events")
    report = api.analyze(sample_dir("rank_exception"), keep=False, signatures=tmp_path)
    mine = [f for f in report["findings"] if f["signature"] == "my-sig"]
    assert mine and mine[0]["summary"] == "seen on 0, 1"
    assert "broken" not in {f["signature"] for f in report["findings"]}
    assert report["verdict"]["signature"] == "rank-crash"  # the built-ins still ran


def test_queries_must_be_a_single_select():
    con, run_id, _ = api.load(sample_dir("healthy"))
    for sql in ("DELETE FROM events", "SELECT 1; DROP TABLE events", "COPY events TO '/tmp/x.csv'"):
        sig = catalog.Signature(id="x", title="t", severity="info", role="context", description="d",
                                origin="test", queries=[sql])
        with pytest.raises(engine.Refused, match="single SELECT"):
            engine.evidence_rows(con, sig, run_id)
    assert con.execute("select count(*) from events").fetchall()[0][0] > 0


def test_templates_take_plain_names_only():
    assert engine.render("rank {rank} at {where}", {"rank": 3}) == "rank 3 at ?"
    assert "template error" in engine.render("{rank.__class__}", {"rank": 3})


def test_an_optional_part_of_a_template_is_left_out_where_its_fields_are_unknown():
    template = "CUDA out of memory[[ on rank(s) {ranks}]][[ at {user_line}]]: {figures}"
    known = {"ranks": "1, 3", "user_line": "train.py:59 in step", "figures": "asking for 2 GiB"}
    assert engine.render(template, known) == "CUDA out of memory on rank(s) 1, 3 at train.py:59 in step: asking for 2 GiB"
    # an excerpt pasted without rank prefixes or traceback: no "rank(s) unknown ... at unknown"
    pasted = {"ranks": "unknown", "user_line": None, "figures": "asking for 2 GiB"}
    assert engine.render(template, pasted) == "CUDA out of memory: asking for 2 GiB"
    # a part holding two fields needs both; text outside the brackets is always written
    assert engine.render("x[[ {a} and {b}]] y {c}", {"a": 1, "b": "", "c": None}) == "x y ?"


def test_a_specific_root_cause_turns_the_general_one_into_context():
    general = engine.Finding("rank-crash", "root_cause", "critical", 0.9, [1], "s", [], "r")
    specific = engine.Finding("native-crash", "root_cause", "critical", 0.85, [1], "s", [], "r",
                              refines=["rank-crash"], explains=["collective-timeout"])
    symptom = engine.Finding("collective-timeout", "symptom", "error", 0.6, [0], "timed out", [], "r")
    ranked = engine.rank_findings([general, symptom, specific])
    assert [f.signature for f in ranked] == ["native-crash", "collective-timeout", "rank-crash"]
    assert general.role == "context" and "explained by native-crash" in symptom.summary
    assert engine.verdict(ranked) is specific


def test_a_specific_cause_refines_a_crash_of_a_rank_its_evidence_names_not_only_its_culprits():
    # collective_mismatch_detail_nccl: rank 0 crashed first raising the mismatch, rank 1 held the odd size
    crash = engine.Finding("rank-crash", "root_cause", "critical", 1.0, [0], "rank 0 died first", [], "r")
    mismatch = engine.Finding("collective-mismatch", "root_cause", "critical", 0.9, [1], "sizes differ",
                              [{"rank": 1, "text": "4000 in"}, {"rank": 0, "text": "4096 in"}], "r",
                              refines=["rank-crash"])
    unrelated = engine.Finding("cuda-oom", "root_cause", "critical", 0.9, [3], "oom", [{"rank": 3}], "r",
                               refines=["rank-crash"])
    assert engine.verdict(engine.rank_findings([crash, mismatch])) is mismatch and crash.role == "context"
    crash.role = "root_cause"
    assert engine.verdict(engine.rank_findings([crash, unrelated])) is crash  # rank 3's OOM says nothing of rank 0


def test_signatures_test_command_prints_the_evidence(tmp_path):
    result = CliRunner().invoke(app, ["signatures", "test", str(write_sig(tmp_path / "s.toml")),
                                      str(sample_dir("rank_exception"))])
    assert result.exit_code == 0, result.output
    assert "my-sig: matched" in result.output and "ValueError" in result.output


def test_signatures_test_refuses_an_invalid_file_with_a_sentence(tmp_path):
    (tmp_path / "s.toml").write_text("id = 1")
    with pytest.raises(PostmortemError, match="not a valid signature"):
        api.test_signature(tmp_path / "s.toml", sample_dir("healthy"))


def test_exit_code_follows_fail_on(tmp_path, history):
    runner = CliRunner()
    crashed = str(sample_dir("rank_sigkill"))
    assert runner.invoke(app, ["analyze", crashed, "-q"]).exit_code == 1
    assert runner.invoke(app, ["analyze", crashed, "-q", "--fail-on", "critical"]).exit_code == 1
    assert runner.invoke(app, ["analyze", str(sample_dir("healthy")), "-q"]).exit_code == 0


def test_every_scenario_names_only_known_signature_ids():
    names = scenario_names()
    assert names, "sample_logs/ has no scenarios"
    for name in names:
        expected = json.loads((sample_dir(name) / "expected.json").read_text())
        ids = set(expected["signatures"]) | ({expected["root_cause"]} if expected["root_cause"] else set())
        assert ids <= set(catalog.CONTRACT_IDS), (name, ids)
        assert isinstance(expected["culprit_ranks"], list)


RECOGNISED = {s.id for s in catalog.load_all()[0]}


@pytest.mark.parametrize("name", scenario_names())
def test_eval_verdict_is_right_for_every_scenario(name):
    """`postmortem eval`'s own comparison, per scenario: the verdict's signature, its culprit
    ranks and the user's source line; a healthy run has nothing at warning or above."""
    row = evaluated(sample_dir(name))
    assert row["expected"] is None or row["expected"] in RECOGNISED, "a scenario whose root cause has no signature"
    assert row["ok"], row


def test_eval_command_prints_the_table_and_accuracy():
    result = CliRunner().invoke(app, ["eval", str(sample_dir("rank_sigkill")), str(sample_dir("healthy"))])
    assert result.exit_code == 0, result.output
    assert "rank_sigkill" in result.output and "all correct 2/2 (100%)" in result.output
    assert "top-1 1/1 (100%)" in result.output and "benign clean 1/1 (100%)" in result.output


def test_a_result_checks_share_is_computed_once_while_signatures_are_matched_side_by_side():
    """engine.match runs signatures on threads; the collective alignment three checks read must
    still be computed once a matching (seconds at 512 ranks), and one that raised again."""
    import contextvars
    import threading
    import time

    from postmortem import checks

    calls = []

    def slow():
        calls.append(threading.get_ident())
        time.sleep(0.2)
        return ["aligned"]

    with checks.shared_results():
        context = contextvars.copy_context()
        got = []
        threads = [threading.Thread(target=lambda: got.append(context.copy().run(checks.once, ("k",), slow)))
                   for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert got == [["aligned"]] * 4 and len(calls) == 1

        def fails():
            raise RuntimeError("a query was interrupted")

        with pytest.raises(RuntimeError):
            checks.once(("broken",), fails)
        assert checks.once(("broken",), lambda: "computed again") == "computed again"


def test_a_signature_waiting_for_a_shared_result_lets_the_others_run_meanwhile(monkeypatch):
    """Three checks ask for the collective alignment at once: on two threads, the one that is not
    computing it must not sit waiting while other signatures are left to run (it is tried again
    after them); its findings, and every signature's, come back in the signatures' order."""
    import threading

    from postmortem import checks

    other_ran = threading.Event()

    def alignment():  # finishes only once a signature that needs nothing shared has run beside it
        assert other_ran.wait(10), "the second thread waited for the shared result instead of matching the others"
        return ["aligned"]

    def rows(con, sig, run_id):
        if sig.id.startswith("shared"):
            return [{"rank": 0, "text": f"{sig.id} {checks.once(('alignment', run_id), alignment)[0]}"}]
        other_ran.set()
        return [{"rank": 1, "text": sig.id}]

    monkeypatch.setattr(engine, "evidence_rows", rows)
    monkeypatch.setattr(engine, "MATCH_THREADS", 2)
    sigs = [catalog.Signature(id=i, title="t", severity="warning", role="symptom", description="d", origin="test",
                              queries=["SELECT 1"]) for i in ("shared-1", "shared-2", "shared-3", "other-1", "other-2")]

    class Cursors:  # (the engine gives each signature a cursor of its own)
        def cursor(self):
            return self

        def close(self):
            pass

    with checks.shared_results():
        got = list(engine._evidence_of_each(Cursors(), "run", sigs))
    assert [(sig.id, found, exc) for sig, found, exc in got] == [
        ("shared-1", [{"rank": 0, "text": "shared-1 aligned"}], None),
        ("shared-2", [{"rank": 0, "text": "shared-2 aligned"}], None),
        ("shared-3", [{"rank": 0, "text": "shared-3 aligned"}], None),
        ("other-1", [{"rank": 1, "text": "other-1"}], None),
        ("other-2", [{"rank": 1, "text": "other-2"}], None),
    ]


def test_a_users_signature_of_a_built_in_id_leaves_the_built_in_to_the_next_analysis(tmp_path):
    """The built-in signatures are parsed once a process: a user's file that replaces one in one
    analysis must not replace it in the next."""
    write_sig(tmp_path / "mine.toml", id="graph-break")
    mine, _ = catalog.load_all(tmp_path)
    assert next(s for s in mine if s.id == "graph-break").origin == str(tmp_path / "mine.toml")
    again, _ = catalog.load_all()
    assert next(s for s in again if s.id == "graph-break").origin == "built-in"


@pytest.mark.parametrize("scenario", ["hang_dataloader_nccl", "lock_wait_in_save", "rank_sigkill", "fsdp_desync",
                                      "silent_hang_killed", "rank_frozen"])
def test_checks_that_share_what_they_read_find_what_each_finds_alone(scenario):
    """The checks of one matching read the rank endings, timeouts and stack positions once
    (``checks.once``): each finds what it finds when it works them out itself (a check that changed
    what it shares would change what the next one finds)."""
    from postmortem import checks, pipeline

    con, run_id, _ = pipeline.load(sample_dir(scenario))
    sigs, _ = catalog.load_all(None)
    alone = {s.id: engine.evidence_rows(con, s, run_id) for s in sigs}
    with checks.shared_results():
        shared = {s.id: engine.evidence_rows(con, s, run_id) for s in sigs}
    assert shared == alone
    assert any(rows for sid, rows in alone.items() if sid in ("collective-hang", "rank-crash", "timeout-misconfigured"))
