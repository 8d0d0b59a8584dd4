FROM python:3.11-slim
ENV PYTHONUNBUFFERED=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /app
COPY pyproject.toml README.md manage.py ./
COPY console console
COPY registry registry
COPY serving serving
COPY templates templates
COPY static static
RUN pip install --no-cache-dir .
EXPOSE 8000 8001 9001
CMD ["python", "manage.py", "start", "--host", "0.0.0.0", "--no-demo"]
