# The rankscope image the compose stack's collector and analyzer services run.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY rankscope ./rankscope
COPY collector ./collector
COPY simulator ./simulator
COPY analyzer ./analyzer
COPY dashboards ./dashboards
COPY evaluation ./evaluation
COPY events ./events
COPY actions ./actions
RUN pip install .[kubernetes] && rankscope --version

RUN useradd --create-home --uid 10001 rankscope
USER rankscope
WORKDIR /home/rankscope
CMD ["rankscope", "--help"]
