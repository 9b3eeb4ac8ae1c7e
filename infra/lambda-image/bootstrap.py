"""The stand-in image's Python runtime start (infra/lambda-image/build.sh).

The import path Lambda's Python runtime gives a function, first to last: the
function's code (LAMBDA_TASK_ROOT), the layers' site-packages and /opt/python;
then AWS's runtime interface client takes the invocations.
"""

import os
import sys

if "PYTHONPATH" not in os.environ:
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    front = [os.environ.get("LAMBDA_TASK_ROOT", "/var/task"), f"/opt/python/lib/{version}/site-packages",
             "/opt/python"]
    sys.path[:0] = [p for p in front if p not in sys.path]

from awslambdaric.__main__ import main  # noqa: E402  (after the path is set)

# Lambda sets _HANDLER; the SAM CLI's emulator gives AWS_LAMBDA_FUNCTION_HANDLER.
main([sys.argv[0], os.environ.get("_HANDLER") or os.environ["AWS_LAMBDA_FUNCTION_HANDLER"]])
