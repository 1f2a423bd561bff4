# PolyKV: the same set-up as the README's first command, in a container.
#   docker build --build-context shared=../shared -t polykv .
#   docker run --rm polykv                    # demo generation with the mixed plan
#   docker run --rm polykv bash .ci/run       # the test suite
FROM python:3.11-slim

WORKDIR /opt/polykv
ENV PYTHON=python3.11 \
    POLYKV_HOME=/opt/polykv-home \
    POLYKV_DEMO_CHECKPOINT=/opt/stories260K \
    HF_HUB_OFFLINE=1 \
    PYTHONUNBUFFERED=1

# Dependencies first so that code edits do not reinstall torch.
COPY requirements.txt pyproject.toml README.md ./
COPY .ci .ci
COPY polykv polykv
RUN bash .ci/setup

# The demo checkpoint comes from the shared folder beside the repository (a named build context).
COPY --from=shared models/stories260K /opt/stories260K
COPY plans plans
COPY tests tests
COPY benchmarks benchmarks
# Import the demo model once at build time, so the first run starts at once.
RUN .venv/bin/python -c "from polykv.models import demo_model_dir; print(demo_model_dir())"

CMD [".venv/bin/polykv", "generate"]
