"""dpstudy.util.quick_exit: an exit that keeps what an exit must do and skips the teardown."""

import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent(
    """
    import atexit, concurrent.futures, pathlib, sys, tempfile, threading, time
    from dpstudy.util.quick_exit import exit_now

    out = pathlib.Path(sys.argv[1])
    atexit.register(lambda: (out / "atexit").write_text("ran"))
    kept = tempfile.TemporaryDirectory(dir=out)  # removed by its finalizer, an atexit handler
    (out / "tmpdir").write_text(kept.name)

    def late():
        time.sleep(0.3)
        (out / "thread").write_text("joined")

    threading.Thread(target=late).start()  # not a daemon: an exit waits for it
    pool = concurrent.futures.ThreadPoolExecutor(1)  # an idle worker: an exit's hook stops it
    pool.submit(time.sleep, 0)

    class Teardown:  # finalized only by the interpreter's teardown, which exit_now skips
        def __del__(self):
            (out / "teardown").write_text("ran")

    keep = Teardown()
    sys.stdout.write("buffered, no newline")  # a pipe: block-buffered until flushed
    exit_now(3)
    """
)


def test_exit_now_keeps_the_exit_code_threads_atexit_and_output_but_not_the_teardown(tmp_path):
    """What a normal exit does, in its order, and nothing of the teardown; an idle thread pool
    (torch.compile keeps one) stops rather than holding the exit forever."""
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 3, proc.stderr
    assert proc.stdout == "buffered, no newline"
    assert (tmp_path / "atexit").read_text() == "ran"
    assert (tmp_path / "thread").read_text() == "joined"
    assert not (tmp_path / (tmp_path / "tmpdir").read_text()).exists()
    assert not (tmp_path / "teardown").exists()


def test_finish_reads_a_result_as_sys_exit_does():
    """A script's main may return None (0), a status or a message (stderr, 1), as sys.exit takes them."""

    def ended(result: str) -> subprocess.CompletedProcess:
        code = f"from dpstudy.util.quick_exit import finish; print('out', end=''); finish({result})"
        return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)

    assert [(p.returncode, p.stdout, p.stderr) for p in map(ended, ("None", "0", "2", "'error: no records'"))] == [
        (0, "out", ""),
        (0, "out", ""),
        (2, "out", ""),
        (1, "out", "error: no records\n"),
    ]
