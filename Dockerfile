FROM python:3.11-slim
ENV PYTHONUNBUFFERED=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /app
# Dependencies first, each at the version and sha256 the runtime lock names (the base and the
# grpc, s3 and fast-json extras: docs/operator/installing.md): a layer that changes only with
# the lock. Then the project itself, resolving nothing.
COPY requirements/runtime-lock.txt requirements/runtime-lock.txt
RUN pip install --no-cache-dir --require-hashes --no-deps -r requirements/runtime-lock.txt
COPY pyproject.toml README.md manage.py ./
COPY console console
COPY mmc mmc
COPY registry registry
COPY serving serving
COPY templates templates
COPY static static
RUN pip install --no-cache-dir --no-deps .
EXPOSE 8000 8001 9001
CMD ["python", "manage.py", "start", "--host", "0.0.0.0", "--no-demo"]
