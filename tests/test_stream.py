"""The stream executor with plain numpy stage functions: order, failures, shutdown, bad input.

Nothing here asserts on time: sleeps only shuffle when stages finish, and the statistics are
checked for their shape, not their values.
"""

from __future__ import annotations

import os
import threading
import time

import numpy as np
import pytest

from codl_tvm.core.errors import CodlError, ModelError, PlannerError
from codl_tvm.runtime.stream import StreamStage, StreamStats, run_stream


def stream_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("codl-stream")]


@pytest.fixture(autouse=True)
def no_threads_left():
    """Every test leaves no stream thread behind (the clean-shutdown check of every test)."""
    assert stream_threads() == []
    yield
    assert stream_threads() == []


def sleepy(fn, seed: int, most_s: float = 0.004):
    """``fn`` after a random sleep: stages finish frames out of step with each other."""
    rng = np.random.default_rng(seed)
    delays = rng.uniform(0.0, most_s, 1000)
    count = iter(range(1000))

    def stage(x):
        time.sleep(delays[next(count)])
        return fn(x)

    return stage


def frames(n: int, shape=(2, 3)) -> list[np.ndarray]:
    return [np.full(shape, float(i)) for i in range(n)]


def test_outputs_in_input_order_with_random_stage_times():
    fns = [lambda x: x + 1.0, lambda x: x * 2.0, lambda x: x - 3.0]
    stages = [sleepy(fn, seed) for seed, fn in enumerate(fns)]
    inputs = frames(40)
    with run_stream(stages, inputs, queue_size=1, timeline=True) as stream:
        outputs = list(stream)
    expected = [(x + 1.0) * 2.0 - 3.0 for x in inputs]
    assert len(outputs) == len(expected)
    for got, want in zip(outputs, expected, strict=True):
        np.testing.assert_array_equal(got, want)
    stats = stream.stats()
    assert isinstance(stats, StreamStats)
    assert stats.frames == 40
    assert stats.stage_names == ("stage0", "stage1", "stage2")
    assert len(stats.stage_busy_s) == 3 and all(b >= 0 for b in stats.stage_busy_s)
    assert stats.frames_per_s >= 0 and stats.latency_p99_ms >= stats.latency_median_ms >= 0
    # one span per stage run, each stage's frames in order
    assert len(stats.spans) == 3 * 40
    for s in range(3):
        assert [f for st, f, _, _ in stats.spans if st == s] == list(range(40))
    # the steady rate is measured between the first output and the last, and the fill is the
    # first frame's way through every stage: both from the last stage's own spans
    ends = sorted(t1 for st, _, _, t1 in stats.spans if st == 2)
    assert stats.steady_frames_per_s == pytest.approx(39 / (ends[-1] - ends[0]))
    assert stats.fill_ms == pytest.approx(ends[0] * 1e3)


def test_frames_from_a_lazy_iterator():
    source = (np.arange(4.0) + i for i in range(10))
    outputs = list(run_stream([np.negative, StreamStage(np.abs, name="abs")], source))
    for i, out in enumerate(outputs):
        np.testing.assert_array_equal(out, np.arange(4.0) + i)


class StageFailure(ValueError):
    pass


def test_a_raising_stage_stops_the_stream_with_its_error():
    seen = []
    raised = []

    def bad(x):
        if x[0, 0] == 5.0:
            raised.append(StageFailure("frame five is bad"))
            raise raised[0]
        return x

    def record(x):
        seen.append(float(x[0, 0]))
        return x

    stages = [sleepy(lambda x: x, 0), StreamStage(bad, name="checker"), sleepy(record, 1)]
    stream = run_stream(stages, frames(200))
    with pytest.raises(StageFailure, match="frame five is bad") as err:
        list(stream)
    assert err.value is raised[0]
    assert "raised in the stream by stage 'checker' on frame 5" in err.value.__notes__
    assert 5.0 not in seen and len(seen) < 200
    # the stream is over: no thread left, and iterating again ends at once
    assert not any(t.is_alive() for t in stream.threads)
    assert list(stream) == []


def test_a_failing_frame_source_stops_the_stream():
    def source():
        yield np.zeros(2)
        yield np.ones(2)
        raise OSError("camera unplugged")

    with pytest.raises(OSError, match="camera unplugged") as err:
        list(run_stream([np.negative], source()))
    assert "raised in the stream by the frame source on frame 2" in err.value.__notes__


def test_a_failing_setup_stops_the_stream():
    def setup():
        raise RuntimeError("no such device")

    with pytest.raises(RuntimeError, match="no such device"):
        list(run_stream([StreamStage(np.negative, name="gpu", setup=setup)], frames(3)))


def test_leaving_early_shuts_every_thread_down():
    # The consumer takes two outputs of a long stream and leaves: the feeder and the stages are
    # blocked on full queues; closing must stop them all (the fixture checks no thread is left).
    with run_stream([lambda x: x + 1, lambda x: x * 2], frames(1000), queue_size=1) as stream:
        first = [next(stream), next(stream)]
    np.testing.assert_array_equal(first[1], (frames(2)[1] + 1) * 2)
    assert not any(t.is_alive() for t in stream.threads)


@pytest.mark.parametrize("source", [[], iter([]), np.zeros((0, 3))], ids=["list", "iter", "array"])
def test_empty_stream_refused(source):
    with pytest.raises(ModelError, match="the stream has no frames") as err:
        run_stream([np.negative], source)
    assert isinstance(err.value, CodlError)


def test_shape_mismatch_refused_before_any_frame_runs():
    calls = []
    inputs = frames(6)
    inputs[4] = np.zeros((3, 2))

    def stage(x):
        calls.append(x)
        return x

    with pytest.raises(ModelError, match=r"frame 4: shape \(3, 2\) differs .* \(2, 3\)"):
        run_stream([stage], inputs, input_shape=(2, 3))
    with pytest.raises(ModelError, match="frame 4"):
        run_stream([stage], inputs, input_shape="first")
    assert calls == []
    # frames of one shape, but not the declared one
    with pytest.raises(ModelError, match=r"frame 0: shape \(2, 3\) differs"):
        run_stream([stage], frames(2), input_shape={"data": (2, 3)})
    assert calls == []


def test_shape_mismatch_from_an_iterator_stops_before_that_frame_runs():
    shapes = []

    def source():
        yield {"data": np.zeros((1, 3))}
        yield {"data": np.zeros((1, 3))}
        yield {"data": np.zeros((1, 4))}

    def stage(x):
        shapes.append(x["data"].shape)
        return x

    with pytest.raises(ModelError, match=r"frame 2: shape \{'data': \(1, 4\)\}"):
        list(run_stream([stage], source(), input_shape={"data": [1, 3]}))
    assert (1, 4) not in shapes


def test_bad_stages_refused_before_any_frame_runs():
    calls = []

    def stage(x):
        calls.append(x)
        return x

    with pytest.raises(PlannerError, match="at least one stage"):
        run_stream([], frames(2))
    with pytest.raises(PlannerError, match="stage 1 is not callable"):
        run_stream([stage, "resnet"], frames(2))
    missing = max(os.sched_getaffinity(0)) + 1000
    with pytest.raises(PlannerError, match=f"pinned to cores \\[{missing}\\]"):
        run_stream([stage, StreamStage(stage, name="little", cores=(missing,))], frames(2))
    with pytest.raises(PlannerError, match="queue_size must be a positive integer"):
        run_stream([stage], frames(2), queue_size=0)
    assert calls == []


def test_a_pinned_stage_runs_on_its_cores_only():
    core = min(os.sched_getaffinity(0))
    before = os.sched_getaffinity(0)
    where = []

    def stage(x):
        where.append(os.sched_getaffinity(0))
        return x

    list(run_stream([StreamStage(stage, name="big", cores=(core,)), np.negative], frames(3)))
    assert where == [{core}] * 3
    # the caller's thread keeps its own cores
    assert os.sched_getaffinity(0) == before


@pytest.mark.skipif(
    not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2,
    reason="needs thread affinity and two cores",
)
def test_a_stream_started_from_a_pinned_thread_may_use_the_process_cores():
    """TVM's pool pins the thread that runs it: a stream started later from that thread may
    still pin a stage to any core of the process (the device benchmark's second model was
    refused its cores)."""
    cores = sorted(os.sched_getaffinity(0))
    result = {}

    def caller():
        os.sched_setaffinity(0, {cores[0]})
        try:
            stage = StreamStage(np.negative, name="big", cores=(cores[-1],))
            result["out"] = list(run_stream([stage], frames(2)))
        except Exception as exc:  # reported below, the thread must not die silently
            result["error"] = exc

    t = threading.Thread(target=caller)
    t.start()
    t.join()
    assert "error" not in result, result
    np.testing.assert_array_equal(result["out"][1], -frames(2)[1])


@pytest.mark.skipif(
    not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2,
    reason="needs thread affinity and two cores",
)
def test_a_process_that_inherited_a_narrow_mask_may_use_every_allowed_core():
    """A build worker spawned from a thread TVM's pool had pinned inherits that thread's mask:
    its groups are still checked against the cores its cpuset allows (the device benchmark's
    stage builds were refused cores 8-15 in such workers)."""
    import ast
    import subprocess
    import sys

    cores = sorted(os.sched_getaffinity(0))
    code = (
        f"import os; os.sched_setaffinity(0, {{{cores[0]}}}); "
        "from codl_tvm.runtime.stream import process_cpus; print(sorted(process_cpus()))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert set(cores) <= set(ast.literal_eval(out.stdout)), out.stdout


def test_cpu_lists_parse_as_the_kernel_writes_them():
    from codl_tvm.core.groups import parse_cpu_list

    assert parse_cpu_list("0-3,8,10-11\n") == {0, 1, 2, 3, 8, 10, 11}
    assert parse_cpu_list("5") == {5}
