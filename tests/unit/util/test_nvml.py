import subprocess
import sys

import pynvml

from dpstudy.util import nvml


def nvml_answers() -> bool:
    """pynvml's own verdict: whether NVML initialises on this host."""
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return False
    pynvml.nvmlShutdown()
    return True


def test_without_the_drivers_library_no_gpus_and_pynvml_is_not_imported():
    # in a process of its own: the test's worker has imported pynvml
    probe = "import sys; from dpstudy.util import nvml; print(nvml.gpu_count(), 'pynvml' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout.split()
    assert not nvml_answers() or nvml.driver_library()  # NVML never answers where the guard says no
    if not nvml.driver_library():
        assert not nvml_answers() and out == ["0", "False"]
    else:  # a GPU host (make gpu-check): NVML answers
        assert int(out[0]) >= 1 and out[1] == "True"
