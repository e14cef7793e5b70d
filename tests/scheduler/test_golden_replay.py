"""The simulator's decisions on a fixed trace are those recorded before the simulator moved
into `scheduler/sim/` and plan's memo became an explicit `IndexCache` (issue #11 item 4):
the whole action log of every policy, without and with bookings, equals the golden log."""

from tests.scheduler.golden_replay import action_row, load_golden, replay_logs


def test_action_log_equals_the_golden_log():
    golden = load_golden()
    logs = replay_logs()
    assert sorted(logs) == sorted(golden)
    for scenario, golden_rows in golden.items():
        rows = logs[scenario]
        for number, (row, golden_row) in enumerate(zip(rows, golden_rows, strict=False)):
            # JSON turned tuples into lists; compare like with like.
            assert [row[0], row[1], row[2]] == golden_row, f"{scenario}: action {number} differs"
        assert len(rows) == len(golden_rows), scenario


def test_action_rows_are_plain_data():
    from scheduler import Reason, RunKind, Start, Stop

    start = Start(job_id=1, gpu_ids=(3, 4), must_end_by=10.0, kind=RunKind.BACKFILL)
    assert action_row(5.0, start) == [5.0, "Start", {
        "job_id": 1, "gpu_ids": [3, 4], "must_end_by": 10.0, "kind": "backfill",
        "reservation_id": None, "estimated_end": None, "preemptible": False,
    }]
    stop = Stop(run_id=2, reason=Reason.SLOT_ENDING, grace_s=60.0, kill_at=70.0)
    assert action_row(1.0, stop)[2]["reason"] == "slot_ending"


def test_manage_py_simulate_is_a_thin_wrapper_of_the_simulator(tmp_path, capsys):
    from django.core.management import call_command

    from tests.scheduler.golden_replay import TRACE

    output = tmp_path / "report.json"
    call_command(
        "simulate", "--", "--trace", str(TRACE), "--gpus", "64", "--policy", "fifo",
        "--reservation-share", "0", "--json", str(output),
    )
    import json

    report = json.loads(output.read_text())
    assert report["scenario"]["jobs"] == 400
    assert report["policies"]["fifo"]["jobs_completed"] == 400
