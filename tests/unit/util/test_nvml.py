import ctypes
import subprocess
import sys

from dpstudy.util import nvml


def driver_loads() -> bool:
    try:
        ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return False
    return True


def test_without_the_drivers_library_no_gpus_and_pynvml_is_not_imported():
    # in a process of its own: the test's worker may have imported pynvml already
    probe = "import sys; from dpstudy.util import nvml; print(nvml.gpu_count(), 'pynvml' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout.split()
    assert nvml.driver_library() == driver_loads()
    if not driver_loads():
        assert out == ["0", "False"]
    else:  # a GPU host (make gpu-check): NVML answers
        assert int(out[0]) >= 1 and out[1] == "True"
