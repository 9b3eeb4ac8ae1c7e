"""`python -m outbox_tools.local_ses` needs moto, which only the `local` extra (and
`dev`) installs: without it, one line naming the extra, no traceback."""

from __future__ import annotations

import subprocess
import sys

# moto as absent as it is from a plain wheel install (None in sys.modules: "import halted")
WITHOUT_MOTO = ("import runpy, sys; sys.modules['moto'] = None; sys.argv = ['local_ses']; "
                "runpy.run_module('outbox_tools.local_ses', run_name='__main__')")


def test_local_ses_without_moto_names_the_extra_in_one_line():
    proc = subprocess.run([sys.executable, "-c", WITHOUT_MOTO], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1, proc.stderr
    assert proc.stdout == "" and "Traceback" not in proc.stderr
    (line,) = proc.stderr.splitlines()
    assert "moto" in line and "pip install 'outbox-relay[local]'" in line
