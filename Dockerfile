FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY dsh_core ./dsh_core
COPY producers ./producers
COPY consumers ./consumers
COPY dsh_pipeline ./dsh_pipeline
RUN pip install --no-cache-dir .
ENTRYPOINT ["dsh-pipeline"]
