"""The torch and staged planes' stream ordering (issue 30 item 4), device-agnostic: fake streams stand in
for CUDA's and record the order of waits, copies and digests. On CUDA: side-stream work waits for the
caller's current stream; the commit copy runs on the current stream after the side stream, and the
side stream then waits for that copy (the staging rows are shared by every layer). No GPU is needed."""
import contextlib

from eplb.planes.staged import StagedPlane
from eplb.planes.torch_plane import TorchPlane


class FakeStream:
    def __init__(self, name, log):
        self.name, self.log = name, log

    def wait_stream(self, other):
        self.log.append(f"{self.name} waits {other.name}")

    def synchronize(self):
        self.log.append(f"{self.name} synchronized")


class FakeCuda:
    def __init__(self, log):
        self.log, self.current = log, FakeStream("current", log)

    def current_stream(self, device=None):
        return self.current

    @contextlib.contextmanager
    def stream(self, stream):
        self.log.append(f"on {stream.name}")
        yield


class FakeRows:
    device = "cuda:0"

    def __init__(self, log):
        self.log = log

    def copy(self, copies):
        self.log.append(f"copy {len(copies)}")

    def digest(self, rows):
        self.log.append("digest")
        return [0] * len(rows)


def plane(log, device: bool):
    made = TorchPlane.__new__(TorchPlane)  # no process group: only the stream logic is under test
    made._torch = type("FakeTorch", (), {"cuda": FakeCuda(log)})()
    made._rows, made._side = FakeRows(log), FakeStream("side", log) if device else None
    return made


def test_side_stream_work_waits_for_the_callers_stream():
    log = []
    made = plane(log, device=True)
    made.digest([(0, 1, 2)])
    made.copy([((0, 1, 0), (0, 0, 2))])
    assert log == ["side waits current", "on side", "digest", "side waits current", "on side", "copy 1"]


def test_commit_is_ordered_after_the_side_stream_and_before_its_next_work():
    log = []
    plane(log, device=True).commit([((0, 0, 2), (0, 1, 0))])
    assert log == ["current waits side", "copy 1", "side waits current"]


def test_on_the_cpu_there_is_no_stream_to_order():
    log = []
    made = plane(log, device=False)
    made.commit([((0, 0, 2), (0, 1, 0))])
    made.digest([(0, 1, 2)])
    assert log == ["copy 1", "digest"]


class FakeRow:
    def __init__(self, log):
        self.log = log

    def copy_(self, source, non_blocking=False):
        self.log.append(f"device copy{' (async)' if non_blocking else ''}")


def test_the_staged_plane_orders_a_layer_once_and_copies_on_the_side_stream():
    """Landing a layer's received rows: one wait for the caller's stream, every copy on the side stream
    (the default device copy, not the test hook), then one synchronize before the rows are digested."""
    log = []
    made = StagedPlane.__new__(StagedPlane)
    made._torch = type("FakeTorch", (), {"cuda": FakeCuda(log)})()
    made._rows, made._side = FakeRows(log), FakeStream("side", log)
    made._device_copy = made._copy_on_side_stream
    made._landing = [(FakeRow(log), None) for _ in range(3)]
    made._land()
    assert log == ["side waits current", "on side"] + ["device copy (async)"] * 3 + ["side synchronized"]
    assert made._landing == []
