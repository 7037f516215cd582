"""Text logs as users have them: other launchers' prefixes, bracketed timestamps, excerpts that
start mid-table or mid-traceback, bare exception lines. Every line here is copied from a case of
tests/realworld/ (a public thread, re-rendered; its folder is named) or, where it says so, from
a run of the project's own generator."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl

from postmortem import api
from postmortem.discover import classify, is_json_document
from postmortem.parsers import textlog
from postmortem.parsers.lines import split_lines
from postmortem.parsers.source import Source

REALWORLD = Path(__file__).resolve().parent / "realworld"


def parse_text(tmp_path: Path, text: str, rank: int | None = None) -> dict[str, pl.DataFrame]:
    path = tmp_path / "pasted.log"
    path.write_text(text)
    source = Source(path=path, name=path.name, kind="text_log", rank=rank, year=2026)
    tables: dict[str, list[pl.DataFrame]] = {}
    for table, frame in textlog.parse(source):
        tables.setdefault(table, []).append(frame)
    return {t: pl.concat(frames) for t, frames in tables.items()}


def events(tables, kind: str) -> list[dict]:
    return tables["events"].filter(pl.col("kind") == kind).to_dicts()


def test_launcher_prefixes_give_the_rank_and_are_cut_off_the_text():
    lines = [
        # d_llamafactory_linenum_prefixed_timeout_7396: a viewer's line numbers before torch's prefix
        "[80747] [rank4]:[E321 02:07:08.414640780 ProcessGroupNCCL.cpp:607] [Rank 4] Watchdog caught",
        # d_milabench_nccl_timeout_wrapped_269: a runner's host and stream tag
        "dinov2-giant-nodes.node04 [stderr] [rank14]:[E909 09:55:29.307629539 ProcessGroupNCCL.cpp:607] [Rank 14]",
        # open-mmlab/mmcv#1240 (horovod under mpirun --tag-output)
        "[1,3]<stderr>:2021-08-04 11:52:22,414 - mmdet - INFO - Epoch [1][7400/14659]\tlr: 1.000e-02",
        # horovod/horovod#3827 (horovodrun's own tag)
        "[1]<stdout>:test_common.py::CommonTests::test_gloo_built PASSED",
        # torchrun --tee before the rank's own prefix (this project's samples)
        "[default1]:[rank1]: Traceback (most recent call last):",
    ]
    frame = split_lines("\n".join(lines), 1)
    assert frame["rank"].to_list() == [4, 14, 3, 1, 1]
    assert frame["tee"].to_list() == [False, False, False, False, True]
    assert [t[:6] for t in frame["text"]] == ["[E321 ", "[E909 ", "2021-0", "test_c", " Trace"]


def test_rays_and_vllms_process_tag_is_a_prefix_cut_off_the_text():
    unsupported = ("torch._dynamo.exc.Unsupported: Logger not supported for non-export cases. To avoid graph breaks "
                   "caused by logger in compile-mode, it is recommended to disable logging by adding logging methods "
                   "to config.ignore_logger_methods")
    frame_line = ('   File "/home/user/vllm-source/vllm/model_executor/models/deepseek_v2.py", line 1164, in forward')
    watchdog = ("[E ProcessGroupNCCL.cpp:563] [Rank 1] Watchdog caught collective operation timeout: "
                "WorkNCCL(SeqNum=158046, OpType=GATHER, NumelIn=2867200, NumelOut=0, Timeout(ms)=600000) ran for "
                "600027 milliseconds before timing out.")
    lines = [
        # vllm-project/vllm#28249: vLLM's multiprocess executor tags each line like Ray does
        f"(EngineCore_DP0 pid=1251450) {unsupported}",
        "(EngineCore_DP0 pid=1251450) ",
        f"(EngineCore_DP0 pid=1251450) {frame_line}",
        # vllm-project/vllm#5484: a Ray worker's tag before torch's own rank prefix
        f"(RayWorkerWrapper pid=4009) [rank1]:{watchdog}",
    ]
    frame = split_lines("\n".join(lines), 1)
    assert frame["rank"].to_list() == [None, None, None, 1]
    assert frame["text"].to_list() == [unsupported, "", frame_line, watchdog]


def test_srun_label_prefix_gives_the_task_as_rank_under_any_inner_prefix():
    # sample_logs/rank_exception_srun_label (srun --label style: "<task>: " before each line)
    lines = [
        ("0: [W1201 19:22:08.303198590 Utils.hpp:137] Warning: Environment variable TORCH_NCCL_TRACE_BUFFER_SIZE is "
         "deprecated; use TORCH_FR_BUFFER_SIZE instead (function operator())"),
        ("1: 2026-12-01 19:22:08,475 [rank1] host=vm pid=3173 world=2 scenario=rank_exception torch=2.13.0+cpu "
         "device=cpu gpu=none"),
        "1: [rank1]: ValueError: bad batch at step 4: labels shape (64, 16) has NaN rows",
        # a time of day at the start of a line is no task label
        "19:22:08 loss 0.98",
    ]
    frame = split_lines("\n".join(lines), 1)
    assert frame["rank"].to_list() == [0, 1, 1, None]
    assert frame["tee"].to_list() == [False, False, False, False]
    assert [t[:12] for t in frame["text"]] == ["[W1201 19:22", "2026-12-01 1", " ValueError:", "19:22:08 los"]


def test_a_slurm_output_of_every_rank_names_the_rank_that_raised(sample):
    report = api.analyze(sample("rank_exception_srun_label"), keep=False)
    assert report["verdict"]["signature"] == "rank-crash" and report["verdict"]["culprit_ranks"] == [1]
    ended = {r["rank"]: r for r in report["ranks"]}
    assert ended[1]["ended"].startswith("ValueError: bad batch at step 4") and not ended[1]["consequence"]
    assert ended[0]["consequence"] and ended[1]["evidence"]["file"].startswith("slurm-")


def test_gloos_pair_closure_by_a_timeout_is_a_consequence_not_the_crash(sample):
    # sample_logs/hang_dataloader_torch2141 (torch 2.14.1): 30 s into the hang rank 0's backward
    # all-reduce raised "RuntimeError: Application timeout caused pair closure", gloo's other
    # wording of "Timed out waiting 30000ms ..." (hang_dataloader's 2.13 run; 2.13 gives both):
    # rank 1, in Queue.get, is the culprit.
    report = api.analyze(sample("hang_dataloader_torch2141"), keep=False)
    ended = {r["rank"]: r for r in report["ranks"]}
    assert ended[0]["ended"].endswith("Application timeout caused pair closure") and ended[0]["consequence"]
    assert report["verdict"]["signature"] == "collective-hang" and report["verdict"]["culprit_ranks"] == [1]


def test_a_recompile_limit_hit_by_dynamos_own_wrapper_names_the_users_guarded_line(sample):
    # The same recompile_limit scenario, two torch versions' real hit lines:
    #   2.13.0 (sample_logs/recompile_limit): "[4/8] torch._dynamo hit config.recompile_limit (8)"
    #     -- frame 4, the user's MLP.forward, fills its cache first;
    #   2.9.1 (sample_logs/recompile_limit_torch291): "[0/8] torch._dynamo hit config.recompile_limit (8)"
    #     -- frame 0, dynamo's wrapper `inner` (torch/_dynamo/external_utils.py), first.
    # Either way the value that varies is guarded in the user's forward: that line is the verdict's.
    for name, frame in (("recompile_limit", "forward ("), ("recompile_limit_torch291", "inner (")):
        verdict = api.analyze(sample(name), keep=False)["verdict"]
        assert verdict["signature"] == "recompile-limit" and verdict["summary"].startswith(frame), name
        assert verdict["user_line"].endswith("generate/train.py:60"), (name, verdict["user_line"])


def test_a_completed_run_whose_dump_lags_on_completions_is_no_hang(sample):
    # sample_logs/graph_breaks_torch291 (torch 2.9.1, gloo): both ranks logged "done" after the
    # final barrier and exited 0, but rank 0's completion dump counts last_completed_collective 15
    # of 17 enqueued (its peer's: 17). Every rank issued every collective in flight and nothing
    # failed: that is bookkeeping, not a rank that stopped.
    report = api.analyze(sample("graph_breaks_torch291"), keep=False)
    assert report["verdict"]["signature"] == "graph-break"
    assert not [f for f in report["findings"] if f["signature"] == "collective-hang"]


def test_a_line_that_merely_starts_with_a_number_in_brackets_keeps_it():
    # torch's desync report puts the rank first: "[7] finished collective #182, ..." (a format
    # string of ProcessGroupNCCL's desync debug report; no public log of it was found)
    frame = split_lines("[7] finished collective #182, but didn't join collective #183", 1)
    assert frame["rank"].to_list() == [None] and frame["text"][0].startswith("[7] finished")


def test_a_log_whose_lines_open_with_a_bracketed_time_is_text_not_json():
    # d_deepspeed_launcher_return_code_9_3232, c_torchdynamo_cache_limit_whisper_1955
    for case in ("d_deepspeed_launcher_return_code_9_3232", "c_torchdynamo_cache_limit_whisper_1955",
                 "d_llamafactory_linenum_prefixed_timeout_7396"):
        (log,) = [p for p in (REALWORLD / case).iterdir() if p.name != "expected.json"]
        head = log.read_bytes()[:65536]
        assert not is_json_document(head) and classify(head, log.name) == "text_log", case
    assert is_json_document(b'{"job": "1234", "nodes": ["node01"]}\n')
    assert is_json_document(b"[" + b'{"x": "y"},\n' * 8000)  # a JSON document longer than the head


def test_a_bracketed_asctime_header_gives_time_and_level(tmp_path):
    line = ("[2023-04-14 13:11:27,885] [ERROR] [launch.py:434:sigkill_handler] ['/usr/bin/python3', '-u', "
            "'main.py', '--local_rank=0'] exits with return code = -9")  # d_deepspeed_launcher_return_code_9_3232
    row = textlog.with_headers(split_lines(line, 1), 2026).row(0, named=True)
    assert row["level"] == "E" and row["ts"].year == 2023 and row["ts"].second == 27
    failure = events(parse_text(tmp_path, line + "\n"), "agent_failure")
    assert json.loads(failure[0]["attrs"]) == {"exit_code": -9, "local_rank": 0}


def test_a_launcher_error_naming_a_signal_but_no_local_rank_is_a_rankless_crash_by_that_signal(tmp_path):
    # m_pytorch_launch_sigsegv_29889: torch.distributed.launch's CalledProcessError, the user's command
    # cut out of it, so no --local_rank says which worker died
    text = ("Traceback (most recent call last):\n"
            '  File "/home/user/.conda/envs/pytorch/lib/python3.7/site-packages/torch/distributed/launch.py", '
            "line 249, in main\n"
            "    cmd=cmd)\n"
            "subprocess.CalledProcessError: Command XXXXX (my script params) died with <Signals.SIGSEGV: 11>.\n")
    tables = parse_text(tmp_path, text)
    (crash,) = [f for f in tables["failures"].to_dicts() if f["source"] == "signal"]
    assert crash["signal"] == "SIGSEGV" and crash["rank"] is None
    # the same error as a bare line, with no traceback above it
    (bare,) = [f for f in parse_text(tmp_path, text.splitlines()[-1] + "\n")["failures"].to_dicts()
               if f["source"] == "signal"]
    assert bare["signal"] == "SIGSEGV"
    # one that names the worker's local rank is the agent's failure of that rank, not a second crash
    named = ("subprocess.CalledProcessError: Command '['/usr/bin/python3', '-u', 'train.py', '--local_rank=7']' "
             "died with <Signals.SIGSEGV: 11>.\n")  # m_pytorch_launch_sigsegv_61839
    assert not [f for f in parse_text(tmp_path, named)["failures"].to_dicts() if f["source"] == "signal"]


def test_a_bare_exception_line_is_an_exception_with_its_rank_and_message_tail(tmp_path):
    # m_msswift_oom_rank1_2044: the excerpt holds the OOM line with no traceback header above it
    text = ("[rank1]:     per_token_logps = torch.gather(logits.log_softmax(-1), dim=2, index=labels.unsqueeze(2))\n"
            "[rank1]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 8.36 GiB. GPU 1 has a total "
            "capacity of 47.50 GiB of which 1.52 GiB is free.\n")
    tables = parse_text(tmp_path, text)
    (exc,) = events(tables, "exception")
    assert exc["rank"] == 1 and json.loads(exc["attrs"])["exception_type"] == "torch.OutOfMemoryError"
    (oom,) = events(tables, "oom")
    assert json.loads(oom["attrs"])["tried_to_allocate"] == int(8.36 * 2**30)
    # m_tinyworlds_orig_mod_keys_13 style: the keys follow on the next lines
    keys = parse_text(tmp_path, 'RuntimeError: Error(s) in loading state_dict for Net:\n\tMissing key(s) in '
                                'state_dict: "fc.weight", "fc.bias".\n')
    (exc,) = events(keys, "exception")
    assert "Missing key(s)" in json.loads(exc["attrs"])["message_tail"]


def test_a_traceback_end_is_read_once_not_again_as_a_bare_line(sample):
    con, run_id, _ = api.load(sample("rank_exception"))
    per_line = con.execute("SELECT file, line_no, count(*) FROM events WHERE run_id = ? AND kind = 'exception' "
                           "GROUP BY ALL HAVING count(*) > 1", [run_id]).fetchall()
    assert per_line == []


def test_an_oom_quoted_inside_a_log_message_is_not_an_oom_line(tmp_path):
    # this project's cuda_oom_spike_nccl: the step's own log line quotes the error it caught
    line = ("2026-11-29 17:44:30,809 [rank1] flight recorder dumped to /root/out/nccl_trace_rank_1 (12 entries): "
            "step 4 raised OutOfMemoryError: CUDA out of memory. Tried to allocate 256.00 GiB.")
    assert events(parse_text(tmp_path, line + "\n"), "oom") == []
    # m_xtuner_oom_interleaved_88: two ranks' messages interleaved by the terminal are still one
    mixed = ("OutOfMemoryErrorOutOfMemoryError.: : OutOfMemoryErrorCUDA out of memory. Tried to allocate 2.11 GiB "
             "(GPU 6; 39.45 GiB total capacity; 37.14 GiB already allocated; 1.60 GiB free; 37.30 GiB reserved in "
             "total by PyTorch)")
    (oom,) = events(parse_text(tmp_path, mixed + "\n"), "oom")
    assert json.loads(oom["attrs"])["capacity"] == int(39.45 * 2**30)


def test_an_excerpt_that_starts_inside_torchruns_failure_table_still_names_the_rank(tmp_path):
    (log,) = (REALWORLD / "m_megatron_sigsegv_1880").glob("*.log")
    (row,) = parse_text(tmp_path, log.read_text())["failures"].filter(pl.col("source") == "torchrun").to_dicts()
    assert row["rank"] == 0 and row["signal"] == "SIGSEGV" and row["exit_code"] == -11


def test_a_pasted_failure_table_alone_blames_the_rank_that_exited_with_an_error_not_the_one_torn_down(
        sample, tmp_path):
    # What a user pastes of sample_logs/hf_trainer_rank_exception_accelerate: accelerate's traceback
    # and torchrun's table, from the first line after the agent's "failed (exitcode: 1)". Rank 0's
    # SIGTERM, listed first, is the agent tearing it down after rank 1 exited with 1.
    lines = (sample("hf_trainer_rank_exception_accelerate") / "console.log").read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if "failed (exitcode: 1)" in line) + 1
    (tmp_path / "pasted.txt").write_text("\n".join(lines[start:]) + "\n")
    report = api.analyze(tmp_path / "pasted.txt", keep=False)
    assert report["verdict"]["signature"] == "rank-crash" and report["verdict"]["culprit_ranks"] == [1]
    ended = {r["rank"]: r for r in report["ranks"]}
    assert ended[0]["consequence"] and ended[0]["signal"] == "SIGTERM"
    assert ended[1]["torchrun_first_observed"] is True and ended[0]["torchrun_first_observed"] is False
    # no traceback of rank 1 here: the verdict says where its error is, not "fix the error at unknown"
    (crash,) = [f for f in report["findings"] if f["signature"] == "rank-crash"]
    assert "--tee" in crash["remediation"] and "unknown" not in crash["remediation"]


def test_a_launchers_line_naming_only_a_local_rank_gives_that_rank_its_end():
    # d_colossalai_sigkill_local_rank3_3514: "failed (exitcode: -9) local_rank: 3 (pid: ...)", no table
    report = api.analyze(REALWORLD / "d_colossalai_sigkill_local_rank3_3514", keep=False)
    assert report["verdict"]["signature"] == "rank-crash" and report["verdict"]["culprit_ranks"] == [3]
    assert report["ranks"][0]["rank"] == 3 and "SIGKILL" in report["ranks"][0]["ended"]


def test_a_faulthandler_dump_that_lists_other_threads_first_names_the_current_ones_frame(sample, tmp_path):
    # native_crash regenerated on torch 2.11 / Python 3.12: Python 3.12 prints the other threads
    # (one with no Python frame, tqdm's monitor) before the current one
    (log,) = sample("native_crash_torch211").glob("logs/*/attempt_0/1/stderr.log")
    assert "Current thread" not in log.read_text().split("Thread 0x", 1)[0]
    stacks = parse_text(tmp_path, log.read_text(), rank=1)["stacks"]
    crashed = stacks.filter(pl.col("source") == "faulthandler").sort("depth")
    assert crashed["thread"].unique().to_list()[0].startswith("Current thread")
    assert crashed["function"].to_list()[:2] == ["string_at", "train_step"]


def test_a_store_based_barrier_wait_with_ranks_missing_is_a_hang():
    # e_openllama_store_barrier_wandb_hang_47: torch 2.0's c10d waits for 8 ranks, 7 came
    report = api.analyze(REALWORLD / "e_openllama_store_barrier_wandb_hang_47", keep=False)
    assert report["verdict"]["signature"] == "collective-hang"
    assert "7 of 8 ranks reached process-group creation" in report["verdict"]["summary"]


def test_detail_before_1_12_names_one_ranks_fingerprint_and_is_still_a_mismatch():
    # e_speechbrain_inconsistent_collective_old_1166: "Rank 0 is running inconsistent collective: ..."
    report = api.analyze(REALWORLD / "e_speechbrain_inconsistent_collective_old_1166", keep=False)
    assert report["verdict"]["signature"] == "collective-mismatch" and report["verdict"]["culprit_ranks"] == []
    assert "rank 0 ran BROADCAST of shape [4]" in report["verdict"]["summary"]


def test_an_nccl_ras_report_names_the_ranks_that_launched_fewer_operations():
    # e_nccl_ras_opcount_mismatch_1911 (NCCL 2.26.2): 30 ranks at AllGather 640, ranks 12 and 13 at 641
    report = api.analyze(REALWORLD / "e_nccl_ras_opcount_mismatch_1911", keep=False)
    assert report["verdict"]["signature"] == "collective-hang"
    assert report["verdict"]["culprit_ranks"] == [r for r in range(32) if r not in (12, 13)]


def test_an_nccl_ras_report_of_one_rank_behind_names_it(tmp_path):
    # No log of this form was found: the lines follow NCCL's format strings (src/ras/client_support.cc:
    # "%d ranks have launched up to operation %ld", "Rank %d has launched up to operation %ld -- GPU ...")
    text = ("#0-0 (78db921d1c117b4a) MISMATCH\n"
            "  Communicator ranks have different AllReduce operation counts\n"
            "  7 ranks have launched up to operation 64\n"
            "  Rank 7 has launched up to operation 60 -- GPU 3 managed by process 1650386 on node node1\n")
    (tmp_path / "ncclras.txt").write_text(text)
    report = api.analyze(tmp_path, keep=False)
    assert report["verdict"]["signature"] == "collective-hang" and report["verdict"]["culprit_ranks"] == [7]


def test_horovods_stall_inspector_showing_ranks_missing_different_collectives_is_a_mismatch():
    # e_lightning_horovod_stall_missing_ranks_5155: rank 0 never submitted a broadcast, rank 1 the
    # next step's all-reduces (horovodrun's "[0]<stderr>:" prefix on every line)
    report = api.analyze(REALWORLD / "e_lightning_horovod_stall_missing_ranks_5155", keep=False)
    assert report["verdict"]["signature"] == "collective-mismatch" and report["verdict"]["culprit_ranks"] == [0, 1]
    assert "rank 0 is missing broadcast (broadcast.bool.sz), rank 1 is missing allreduce" in report["verdict"]["summary"]


def test_a_segfault_in_a_console_that_names_no_rank_is_a_native_crash_at_the_users_frame():
    # m_hami_allreduce_nvlink_sigsegv_1502: one process's faulthandler dump, no rank prefix anywhere;
    # the crash is still the job's verdict, with the user's frame under dist.all_reduce
    report = api.analyze(REALWORLD / "m_hami_allreduce_nvlink_sigsegv_1502", keep=False)
    verdict = report["verdict"]
    assert verdict["signature"] == "native-crash" and verdict["culprit_ranks"] == []
    assert verdict["user_line"].endswith("infrabench/collective.py:44")


def test_ucxs_caught_signal_line_is_the_ranks_fatal_signal(tmp_path):
    # m_flagscale_nvml_energy_sigsegv_1237: UCX's handler (HPC-X builds) reports the signal itself
    tables = parse_text(tmp_path, "\n".join([
        "[default0]:[node01:1610 :0:1610] Caught signal 11 (Segmentation fault: address not mapped to object at address (nil))",
        "[default0]:==== backtrace (tid:   1610) ====",
        "[default0]: 0  /opt/hpcx/ucx/lib/libucs.so.0(ucs_handle_error+0x2e4) [0x7fab66d08654]",
    ]))
    (failure,) = tables["failures"].filter(pl.col("source") == "ucx").to_dicts()
    assert failure["rank"] == 0 and failure["signal"] == "SIGSEGV"
    assert failure["message"].startswith("Segmentation fault: address not mapped")
    report = api.analyze(REALWORLD / "m_flagscale_nvml_energy_sigsegv_1237", keep=False)
    assert report["verdict"]["signature"] == "native-crash"


def test_a_signal_number_in_a_log_message_is_not_a_crash(tmp_path):
    # a line that merely mentions a signal is no UCX handler line
    tables = parse_text(tmp_path, "2024-01-01 10:00:00 INFO worker exited; handler installed for signal 11\n")
    assert "failures" not in tables or tables["failures"].filter(pl.col("source") == "ucx").is_empty()


def test_detectron2s_anomaly_check_is_a_non_finite_loss_at_its_iteration():
    # c_detectron2_loss_nan_high_lr_508: "FloatingPointError: Loss became infinite or NaN at iteration=27!"
    verdict = api.analyze(REALWORLD / "c_detectron2_loss_nan_high_lr_508", keep=False)["verdict"]
    assert verdict["signature"] == "non-finite-loss" and "at step 27" in verdict["summary"]


def test_an_old_nccl_warn_without_its_nccl_word_is_still_ncclss_warn(tmp_path):
    # d_nccl_tests_no_ip_interface_docker_14 (NCCL 2.2, 2018): "host:pid:tid [dev] file:line WARN msg"
    tables = parse_text(tmp_path, "\n".join([
        "e66aa18dc444:3171:3171 [0] include/socket.h:311 WARN Socket creation failed : Address family not supported by protocol",
        # a logger's WARN with no NCCL header is not NCCL's
        "2024-01-01 10:00:00 main.py:12 WARN disk almost full",
    ]))
    (warn,) = events(tables, "nccl_warn")
    assert warn["message"].startswith("Socket creation failed") and warn["line_no"] == 1
    verdict = api.analyze(REALWORLD / "d_nccl_tests_no_ip_interface_docker_14", keep=False)["verdict"]
    assert verdict["signature"] == "nccl-error"


def test_an_nccl_header_whose_host_was_blanked_out_still_reads_the_warn(tmp_path):
    # d_azhpc_nccl_graph_file_dev_not_found_327: the user's post left "::pid:tid [dev]" of the header
    tables = parse_text(tmp_path, "::16674:17023 [0] graph/search.cc:703 NCCL WARN XML Import Channel : dev 1 not found.\n")
    (warn,) = events(tables, "nccl_warn")
    assert warn["message"].startswith("XML Import Channel : dev 1 not found") and warn["pid"] == 16674


def test_ddps_unused_parameter_lines_pasted_alone_are_the_error_and_under_the_message_its_tail(tmp_path, sample):
    # m_octformer_ddp_unused_indices_line_only_20: the issue holds only the reducer message's last line
    line = ("Parameter indices which did not receive grad for rank 1: 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31 32 "
            "33 34 42 43 44 45 46 47 48 49 50 51 52 53 54 55 56 57 58 59 67 68 69 70 71 72 73 74 75 76 77 78 79 80 ...\n")
    (exc,) = events(parse_text(tmp_path, line), "exception")
    assert exc["message"].startswith("Parameter indices which did not receive grad for rank 1:")
    (tmp_path / "console.log").write_text(line)
    report = api.analyze(tmp_path, keep=False)
    assert report["verdict"]["signature"] == "ddp-unused-parameters" and "17 18 19" in report["verdict"]["summary"]
    # under the message's first line (sample_logs/ddp_unused_parameters: "[rank0]: Parameter indices which
    # did not receive grad for rank 0: 6 7" ends rank 0's RuntimeError) it is that exception's tail, not a second one
    con, run_id, _ = api.load(sample("ddp_unused_parameters"))
    assert con.execute("SELECT count(*) FROM events WHERE run_id = ? AND kind = 'exception' "
                       "AND message LIKE 'Parameter%which did not receive grad%'", [run_id]).fetchone()[0] == 0


def test_ddps_reducer_message_printed_without_its_class_is_the_error_but_not_when_quoted(tmp_path):
    # m_yolox_ddp_unused_convnext_885: the reporter's log is DDP's message alone, no "RuntimeError:"
    report = api.analyze(REALWORLD / "m_yolox_ddp_unused_convnext_885", keep=False)
    assert report["verdict"]["signature"] == "ddp-unused-parameters"
    # the same words inside a sentence of someone's log are a quote, not a raised error
    quoted = "INFO fixed: 'Expected to have finished reduction in the prior iteration' is gone now\n"
    assert not events(parse_text(tmp_path, quoted), "exception")
