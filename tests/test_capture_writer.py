"""A capture's writer process (harness.capture.step_writer, writer="process"): it writes the same trees as the
writer thread, and a failure in it (a full disk, the process killed) is the capture's write error naming the
step, as the thread's is."""

from __future__ import annotations

import errno
import io
import itertools
import pickle
import signal
import threading
from pathlib import Path

import pytest
from test_faults_capture import files
from test_faults_storage import fill, tiny_disk  # noqa: F401 - a fixture: a 64 KiB tmpfs

from harness.capture import capture
from harness.capture.api import CaptureError, CaptureWriteError
from harness.store.dump import Dump
from harness.store.tree import read_tree

pytestmark = pytest.mark.xdist_group("in_process_frameworks")


def model_and_optimizer(torch):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2)


def train(torch, path: Path, steps: int = 3, **options) -> None:
    model, optimizer = model_and_optimizer(torch)
    with capture(model, path, optimizer=optimizer, provenance="test", **options) as cap:
        for step in range(steps):
            loss = model(torch.full((5, 4), float(step + 1))).square().mean()
            cap.loss(loss)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()


@pytest.mark.parametrize("mode, hash", [("digest", "fast"), ("digest", "md5"), ("full", "md5")])
def test_the_writer_process_writes_what_the_thread_writes(torch, tmp_path, mode, hash):
    train(torch, tmp_path / "thread", mode=mode, hash=hash, writer="thread")
    train(torch, tmp_path / "process", mode=mode, hash=hash, writer="process")
    thread, process = files(tmp_path / "thread"), files(tmp_path / "process")
    assert list(thread) == list(process) and len(thread) > 3 * 3  # the manifest, 3 steps of a folder and 2 files
    assert thread == process  # byte for byte: meta, tensors and manifest
    assert len(read_tree(tmp_path / "process").steps) == 3


def test_digest_values_fetched_at_the_steps_end_follow_the_payload_to_the_writer_process(torch, tmp_path, monkeypatch):
    """Digests computed by torch ops (as on a GPU: their values reach the host at the step's end) go to the writer
    process after the step's payload and are made into entries there: the files are the thread's, byte for byte,
    the parameters carried from the step before (their updated digests, settled only when asked) too."""
    from harness.frameworks.torch import TorchAdapter

    monkeypatch.setattr(TorchAdapter, "digest_on_cpu", True)
    train(torch, tmp_path / "thread", mode="digest", hash="fast", writer="thread")
    train(torch, tmp_path / "process", mode="digest", hash="fast", writer="process")
    thread, process = files(tmp_path / "thread"), files(tmp_path / "process")
    assert thread == process and len(process) > 3 * 3
    tree = read_tree(tmp_path / "process")
    for before, after in zip(tree.steps, tree.steps[1:]):
        updated, params = Dump.read(tree.path / before).unstored, Dump.read(tree.path / after).unstored
        carried = {name: entry["fast64"] for name, entry in updated.items() if ":updated." in name}
        assert carried and {name.replace(":updated.", ":param."): digest for name, digest in carried.items()} == \
            {name: entry["fast64"] for name, entry in params.items() if ":param." in name}


def test_values_that_cannot_be_fetched_drop_the_step_and_keep_the_writer_process_in_step(torch, tmp_path, monkeypatch):
    from harness.frameworks.torch import TorchAdapter

    monkeypatch.setattr(TorchAdapter, "digest_on_cpu", True)
    fetch = TorchAdapter.fetch_digests
    failed: list[bool] = []

    def failing_once(self, handles):
        rows = fetch(self, handles)

        def values():
            if not failed:
                failed.append(True)
                raise RuntimeError("the device was lost")
            return rows()
        return values

    monkeypatch.setattr(TorchAdapter, "fetch_digests", failing_once)
    with pytest.raises(RuntimeError, match="the device was lost"):
        train(torch, tmp_path / "a", writer="process", mode="digest", hash="fast")
    train(torch, tmp_path / "b", writer="process", mode="digest", hash="fast")  # the same process, answering in turn
    assert read_tree(tmp_path / "a").steps == [] and len(read_tree(tmp_path / "b").steps) == 3


def test_a_full_disk_under_the_writer_process_names_the_step(torch, tiny_disk):  # noqa: F811
    model, optimizer = model_and_optimizer(torch)
    with pytest.raises(CaptureWriteError) as raised:
        with capture(model, tiny_disk / "tree", mode="digest", hash="fast", writer="process") as cap:
            model(torch.ones(3, 4)).sum().backward()
            fill(tiny_disk)  # after the manifest is written: the step's write fails, in the writer process
            cap.step()
            cap.flush()
    assert str(raised.value).startswith(f"capture: cannot write step 0 (step-00000) of {tiny_disk / 'tree'}: "
                                        "No space left on device")
    assert isinstance(raised.value, OSError)
    assert not [name for name in files(tiny_disk) if name.startswith("tree/step-") or "/." in name]


def test_a_killed_writer_process_is_a_write_error_not_a_hang(torch, tmp_path):
    model, _ = model_and_optimizer(torch)
    with pytest.raises(CaptureWriteError, match=r"step 0 .*the writer process ended \(exit code -9"):
        with capture(model, tmp_path / "tree", mode="digest", hash="fast", writer="process") as cap:
            model(torch.ones(3, 4)).sum().backward()
            cap._process._process.send_signal(signal.SIGKILL)  # the process, as an out-of-memory killer would
            cap._process._process.wait()
            cap.step()
            cap.flush()


def test_steps_written_behind_the_training_stop_at_the_first_write_that_fails(torch, tmp_path, monkeypatch):
    """Digest-only steps are handed over without waiting for the steps before them to be written (up to
    WRITES_AHEAD); a write that fails is raised by a later step(), naming its step, and no step handed over after it
    is written."""
    from harness.capture import api

    real = api.Capture._write_step
    begun, written = threading.Event(), []

    def write_step(self, tree, step, index, pending, rows):
        begun.wait(10)
        if index == 1:
            raise OSError(errno.ENOSPC, "No space left on device")
        real(self, tree, step, index, pending, rows)
        written.append(index)

    monkeypatch.setattr(api.Capture, "_write_step", write_step)
    model, _ = model_and_optimizer(torch)
    handed = 0
    with pytest.raises(CaptureWriteError, match=r"^capture: cannot write step 1 \(step-00001\) .*No space left on device"):
        with capture(model, tmp_path / "tree", mode="digest", hash="fast", writer="thread") as cap:
            for _ in range(api.WRITES_AHEAD + 2):
                model(torch.ones(3, 4)).sum().backward()
                cap.step()
                handed += 1
                if handed == api.WRITES_AHEAD:  # handed over while step 0's write waits
                    assert written == []
                    begun.set()
    assert handed == api.WRITES_AHEAD + 1  # the next step() raised step 1's failure
    assert written == [0] and read_tree(tmp_path / "tree").steps == ["step-00000"]

    # the training fails while step 1's failed write is not raised yet: the block's end notes it, naming its step
    written.clear()
    with pytest.raises(RuntimeError, match="the training failed") as raised:
        with capture(model, tmp_path / "again", mode="digest", hash="fast", writer="thread") as cap:
            for _ in range(api.WRITES_AHEAD):
                model(torch.ones(3, 4)).sum().backward()
                cap.step()
            raise RuntimeError("the training failed")
    assert raised.value.__notes__ == ["xfalign capture: writing step 1 also failed: [Errno 28] No space left on device"]
    assert written == [0] and read_tree(tmp_path / "again").steps == ["step-00000"]


def test_steps_of_digests_alone_go_to_the_writer_process_without_waiting_for_the_device(torch, tmp_path, monkeypatch):
    """The training's thread sends such a step itself, and its digests' values once the device has them: a step()
    waits for the device only to keep at most WRITES_AHEAD steps unwritten, and no step is written before its
    values, the steps in order, as the writer thread writes them."""
    from harness.capture import api
    from harness.frameworks.torch import TorchAdapter

    monkeypatch.setattr(TorchAdapter, "digest_on_cpu", True)  # values fetched at the step's end, as on a GPU
    fetch = TorchAdapter.fetch_digests
    device_done, read = [False], []

    class Later:
        """Rows the device has moved once `device_done`; reading them before waits for the device."""

        def __init__(self, rows):
            self.rows = rows

        def ready(self):
            return device_done[0]

        def __call__(self):
            read.append(device_done[0])
            return self.rows()

    monkeypatch.setattr(TorchAdapter, "fetch_digests", lambda self, handles: Later(fetch(self, handles)))
    model, _ = model_and_optimizer(torch)
    inputs = {"process": itertools.count(1), "thread": itertools.count(1)}

    def steps(cap, count: int) -> None:
        for _ in range(count):
            model(torch.full((5, 4), float(next(inputs[cap.writer])))).sum().backward()
            cap.step()
            for param in model.parameters():
                param.grad = None

    with capture(model, tmp_path / "process", mode="digest", hash="fast", writer="process", provenance="test") as cap:
        assert cap.writer == "process" and cap._direct
        steps(cap, api.WRITES_AHEAD)
        assert read == []  # handed over, none of their values read: the device not done
        steps(cap, 1)
        assert read == [False]  # the oldest's values waited for: WRITES_AHEAD steps unwritten at most
        device_done[0] = True
        steps(cap, 2)
        assert read == [False] + [True] * 4  # the values the device has (of steps 1-4), sent in order
    with capture(model, tmp_path / "thread", mode="digest", hash="fast", writer="thread", provenance="test") as cap:
        steps(cap, api.WRITES_AHEAD + 3)
    assert files(tmp_path / "thread") == files(tmp_path / "process")
    assert len(read_tree(tmp_path / "process").steps) == api.WRITES_AHEAD + 3


def test_the_writer_process_writes_steps_in_order_as_their_values_come_and_none_after_a_failed_one(torch, tmp_path,
                                                                                                   monkeypatch):
    """The process's side of a step sent by the training's thread: a step waits for its values (sent apart, tagged
    with its index, possibly after later steps'), steps are written and answered in order, a step whose values are
    None is dropped, and once a step's write fails the capture's later steps are answered without being written."""
    import time

    from harness.capture.step_writer import StepPayload, WriterProcessError
    from harness.frameworks.torch import TorchAdapter
    from harness.store.fast_hash import fast_entry
    from harness.store.tree_format import step_folder

    monkeypatch.setattr(TorchAdapter, "digest_on_cpu", True)  # a PendingDigest whose values are fetched apart
    adapter = TorchAdapter()
    tensor = torch.arange(4, dtype=torch.float32)
    values = adapter.fetch_digests([adapter.device_digest(tensor).values])()
    name = "(root):param.w"

    def payload(index: int) -> StepPayload:
        return StepPayload(index=index, records=[("(root)", None, "params", [name])], order=[name], tensors={}, stats={},
                           unstored={name: 0}, norms={}, note=None, digests=[("float32", (4,), 16)])

    model, _ = model_and_optimizer(torch)
    tree = tmp_path / "tree"
    with capture(model, tree, mode="digest", hash="fast", writer="process", provenance="test") as cap:
        process = cap._process
        for index in range(3):
            process.send(("step", payload(index)))
        process.send(("values", 1, values))  # step 1's before step 0's: written after it
        time.sleep(0.2)
        assert not process.answered()
        process.send(("values", 0, None))  # step 0 dropped
        process.answer()  # step 0
        process.answer()  # step 1
        assert (tree / step_folder(1)).is_dir() and not (tree / step_folder(0)).exists()
        (tree / step_folder(3)).write_text("in the way")  # step 3's write fails
        for index in (2, 3, 4):
            if index > 2:
                process.send(("step", payload(index)))
            process.send(("values", index, values))
        process.answer()  # step 2
        with pytest.raises((OSError, WriterProcessError)):
            process.answer()  # step 3
        process.answer()  # step 4: answered, not written
        assert not process.answered()
        (tree / step_folder(3)).unlink()
    written = read_tree(tree)
    assert written.steps == [step_folder(1), step_folder(2)] and not (tree / step_folder(4)).exists()
    assert written.step(1).unstored[name] == fast_entry(tensor.numpy())


def test_what_the_writer_process_is_sent_needs_no_framework_to_unpickle(torch, tmp_path, monkeypatch):
    """The writer process imports no framework (torch's import alone takes seconds and hundreds of MiB): the context
    and the steps it is sent refer to no class of the framework's (torch.__version__ is one: a TorchVersion)."""
    from harness.capture import step_writer

    sent: list[tuple] = []
    classes: set[str] = set()

    class Recording(pickle.Unpickler):
        def find_class(self, module, name):
            classes.add(module)
            return super().find_class(module, name)

    real = step_writer._send
    monkeypatch.setattr(step_writer, "_send", lambda stream, message: (sent.append(message), real(stream, message)))
    model, optimizer = model_and_optimizer(torch)
    with capture(model, tmp_path / "tree", optimizer=optimizer, mode="digest", hash="fast", writer="process") as cap:
        loss = model(torch.ones(3, 4)).sum()
        cap.loss(loss)
        loss.backward()
        optimizer.step()
    assert [message[0] for message in sent][:2] == ["open", "step"]
    for message in sent:
        Recording(io.BytesIO(pickle.dumps(message))).load()
    assert "harness.capture.step_writer" in classes
    assert not [module for module in classes if module.split(".")[0] in ("torch", "paddle")]


def test_writer_choices_are_checked(torch, tmp_path):
    model, _ = model_and_optimizer(torch)
    with pytest.raises(CaptureError, match="unknown writer 'disk'; expected one of thread, process"):
        capture(model, tmp_path / "a", writer="disk")
    train(torch, tmp_path / "reference", steps=1, mode="digest", hash="fast")
    with pytest.raises(CaptureError, match="writer='process' cannot check a reference"):
        capture(model, tmp_path / "b", mode="digest", reference=tmp_path / "reference", writer="process")


def test_the_manifest_is_not_rewritten_per_step_but_lists_every_step_on_flush(torch, tmp_path, monkeypatch):
    from harness.store import tree

    written: list[int] = []  # the steps each manifest written lists
    real = tree.write_text_atomic
    monkeypatch.setattr(tree, "write_text_atomic", lambda path, text: (written.append(text.count('"step-')), real(path, text)))
    monkeypatch.setattr(tree, "MANIFEST_INTERVAL", 3600.0)
    model, optimizer = model_and_optimizer(torch)
    with capture(model, tmp_path / "tree", mode="digest", hash="fast", optimizer=optimizer) as cap:
        for _ in range(4):
            model(torch.ones(3, 4)).sum().backward()
            optimizer.step()
        assert written == [0, 1]  # when the capture began, and after its first step
        cap.flush()
        assert written == [0, 1, 4] and len(read_tree(tmp_path / "tree").steps) == 4
        model(torch.ones(3, 4)).sum().backward()
        optimizer.step()
    assert written == [0, 1, 4, 5]  # the end of the block lists the last step


def test_a_writer_process_serves_the_next_capture_and_a_dead_one_is_replaced(torch, tmp_path):
    model, _ = model_and_optimizer(torch)
    pids = []

    def one_step(name: str, kill: bool = False) -> None:
        with capture(model, tmp_path / name, mode="digest", hash="fast", writer="process") as cap:
            pids.append(cap._process._process.pid)
            model(torch.ones(3, 4)).sum().backward()
            if kill:
                cap._process._process.kill()
                cap._process._process.wait()

    one_step("a")
    with pytest.raises(CaptureWriteError, match="the writer process ended"):
        one_step("b", kill=True)
    one_step("c")
    assert pids[0] == pids[1] != pids[2]  # started once for a and b (its imports take seconds); b's killed one replaced
    assert [len(read_tree(tmp_path / name).steps) for name in ("a", "c")] == [1, 1]


def test_ctrl_c_reaching_the_writer_process_does_not_end_it(torch, tmp_path):
    model, _ = model_and_optimizer(torch)
    with capture(model, tmp_path / "tree", mode="digest", hash="fast", writer="process") as cap:
        cap.flush()  # the process has read its first message: its imports are done, its signal handling set
        cap._process._process.send_signal(signal.SIGINT)  # as a terminal's Ctrl-C does, to the process group
        model(torch.ones(3, 4)).sum().backward()
    assert cap._process is None and len(read_tree(tmp_path / "tree").steps) == 1


def test_the_default_writer_follows_the_models_device(torch, tmp_path):
    """A model on the CPU is written by the thread (a process would take a core from the training); one on a GPU,
    where there is one, by the process, unless the capture checks a reference as it runs (the thread's job)."""
    model, _ = model_and_optimizer(torch)
    with capture(model, tmp_path / "cpu", provenance="test") as cap:
        assert cap.writer == "thread"
    if torch.cuda.is_available():
        with capture(model.cuda(), tmp_path / "gpu", provenance="test") as cap:
            assert cap.writer == "process"
