# GPU image for the tokenmill fleet: `docker build -t tokenmill-worker .`. It holds every part
# (the server and lm-evaluation-harness too), so any `tokenmill` command runs from it: the
# entrypoint is `tokenmill worker`; `--entrypoint tokenmill` runs serve, lm-eval, submit, beat.
# tests/system/test_image_context.py stages this context as the COPY lines below copy it and runs
# each command's --help from it.
#
# CUDA runtime base + Python 3.11 + the CUDA build of torch 2.13.0 (from the PyTorch
# CUDA index) and the Triton release matching it, then tokenmill itself. The default model
# is fetched and converted at build time so a worker starts without network access to
# model files. The entrypoint is `tokenmill worker`; configure it with environment
# variables (see docker-compose.yml and pipeline/celery_app.py):
#   TOKENMILL_BROKER_URL, TOKENMILL_RESULT_BACKEND, TOKENMILL_QUEUE,
#   TOKENMILL_S3_ENDPOINT_URL, AWS_*, TOKENMILL_PRELOAD_ENGINE
#
# Change the CUDA line with both build args, e.g.
#   --build-arg CUDA_IMAGE=nvidia/cuda:12.6.3-runtime-ubuntu22.04 --build-arg TORCH_CUDA=cu126
ARG CUDA_IMAGE=nvidia/cuda:12.8.1-runtime-ubuntu22.04
FROM ${CUDA_IMAGE}

ARG TORCH_CUDA=cu128
ARG TORCH_VERSION=2.13.0
ARG TRITON_VERSION=3.9.0

ENV DEBIAN_FRONTEND=noninteractive \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH \
    TOKENMILL_CACHE=/models

# Python 3.11 from deadsnakes. gcc and the Python headers stay: Triton compiles its small
# launcher modules with the host C compiler the first time a kernel runs.
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates gnupg software-properties-common \
    && add-apt-repository -y ppa:deadsnakes/ppa \
    && apt-get update \
    && apt-get install -y --no-install-recommends python3.11 python3.11-venv python3.11-dev gcc libc6-dev \
    && apt-get purge -y software-properties-common && apt-get autoremove -y \
    && rm -rf /var/lib/apt/lists/*

RUN python3.11 -m venv "$VIRTUAL_ENV" && pip install --upgrade pip setuptools wheel

# torch first, from the CUDA index, so installing the project (torch>=2.13; constraints.txt: 2.13.0)
# finds it satisfied (2.13.0+cu128 matches ==2.13.0) instead of pulling the CPU build.
RUN pip install --index-url "https://download.pytorch.org/whl/${TORCH_CUDA}" "torch==${TORCH_VERSION}" \
    && pip install "triton==${TRITON_VERSION}"

WORKDIR /app
COPY pyproject.toml README.md constraints.txt ./
COPY engine ./engine
COPY connectors ./connectors
COPY pipeline ./pipeline
COPY jobs ./jobs
COPY service ./service
COPY harness ./harness
COPY cli ./cli
COPY examples ./examples
# The versions `make test` ran (constraints.txt); torch 2.13.0+cu128 above satisfies its torch line.
RUN pip install -c constraints.txt ".[server,plots,triton,eval]" \
    && python -c "import torch, triton; v = torch.__version__; \
assert v.startswith('${TORCH_VERSION}') and torch.version.cuda, f'expected a CUDA build of torch ${TORCH_VERSION}, got {v}'"

# The default model, converted once into $TOKENMILL_CACHE (readable by the worker user).
RUN python -m engine.model_registry

RUN useradd --create-home --uid 1000 tokenmill && chown -R tokenmill /models
USER tokenmill

ENTRYPOINT ["tokenmill", "worker"]
CMD ["--loglevel", "INFO"]
