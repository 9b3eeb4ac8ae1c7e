"""The template's functions in Lambda containers on a workstation, through the
SAM CLI's own emulator: what `outbox local invoke` and `outbox local
start-lambda` run, and what the sam_local tests call (decisions 0024, 0039).

- `docker`: Docker's engine, found running or started (and stopped again);
- `build`: a python3.12 for `sam build`, the template built for this
  machine's architecture without editing it, and the base image (AWS's, or
  the stand-in infra/lambda-image/build.sh makes where no registry answers);
- `bridges`: PostgreSQL, Redis, moto and a CloudFormation response server
  where a container on Docker's bridge reaches them, and the env-vars file;
- `sam`: `sam local invoke` and `sam local start-lambda` with all of that;
- `session`: one command's run, undone in reverse at its end.

Workstation only: nothing here is in a Lambda layer.
"""
