"""The torch and staged planes' stream ordering (issue 30 item 4), device-agnostic: fake streams stand in
for CUDA's and record the order of waits, copies and digests. On CUDA: side-stream work waits for the
caller's current stream; the commit copy runs on the current stream after the side stream, and the
side stream then waits for that copy (the staging rows are shared by every layer). No GPU is needed."""
import contextlib

from eplb.planes.torch_plane import TorchPlane


class FakeStream:
    def __init__(self, name, log):
        self.name, self.log = name, log

    def wait_stream(self, other):
        self.log.append(f"{self.name} waits {other.name}")


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
